-- Admission: failed authentications (counted and auditable; never the secret or the signature),
-- per-tenant rate-limit buckets, and client request ids (a repeated request creates no second job).
CREATE TABLE admission_auth_failures (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL,
    job_id          text,
    key_id          text,
    claimed_tenant  text,
    reason          text NOT NULL
);
CREATE TABLE admission_rate_buckets (
    tenant      text PRIMARY KEY,
    tokens      double precision NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE TABLE submission_requests (
    tenant      text NOT NULL,
    request_id  text NOT NULL,
    job_id      text NOT NULL,
    PRIMARY KEY (tenant, request_id)
);
