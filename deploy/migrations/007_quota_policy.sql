-- Quota policy (services/quota/policy, used when GPUSCHED_TENANTS_FILE is set): reserved units per leaf
-- tenant per flavor, decayed usage for fair share, each job's reservation and the jobs waiting for quota.

-- limit_units = nominal + borrowing limit (NULL: no borrowing limit; the cohort still bounds it). The CHECK
-- is the last line of defence: decisions lock a cohort's rows FOR UPDATE and charge with a guarded UPDATE.
CREATE TABLE quota_policy_usage (
    tenant          text NOT NULL,
    flavor          text NOT NULL,
    reserved_units  bigint NOT NULL DEFAULT 0,
    limit_units     bigint,
    PRIMARY KEY (tenant, flavor),
    CHECK (reserved_units >= 0 AND (limit_units IS NULL OR reserved_units <= limit_units))
);

-- UsageHistory per tenant: decayed GEQ-seconds per flavor as of as_of_s (seconds since the Unix epoch).
CREATE TABLE quota_policy_history (
    tenant   text PRIMARY KEY,
    as_of_s  double precision NOT NULL,
    geq_s    jsonb NOT NULL DEFAULT '{}'
);

-- What each job holds, so that a release gives back exactly the flavor and units it reserved.
CREATE TABLE quota_policy_reservations (
    job_id  text PRIMARY KEY,
    tenant  text NOT NULL,
    flavor  text NOT NULL,
    units   bigint NOT NULL CHECK (units > 0)
);

CREATE TABLE quota_policy_pending (
    job_id       text PRIMARY KEY,
    tenant       text NOT NULL,
    gpus         integer NOT NULL,
    gpu_model    text,
    priority     integer NOT NULL,
    queued_at_s  double precision NOT NULL,
    last_reason  text
);
CREATE INDEX quota_policy_pending_tenant ON quota_policy_pending (tenant);
