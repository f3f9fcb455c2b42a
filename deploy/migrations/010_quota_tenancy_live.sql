-- The quota service always runs the tenancy policy (services/quota/policy): flat per-tenant caps are
-- retired. Jobs still waiting in the flat queue move to the policy queue; what running jobs held under flat
-- caps is given back without a ledger when they end.
INSERT INTO quota_policy_pending (job_id, tenant, gpus, gpu_model, priority, queued_at_s)
SELECT q.job_id, q.tenant, q.gpus, j.gpu_model, q.priority,
       extract(epoch FROM coalesce(q.submitted_at, j.submitted_at, now()))
FROM quota_pending q LEFT JOIN jobs j USING (job_id)
ON CONFLICT DO NOTHING;
DROP TABLE quota_pending;
DROP TABLE quota_ledger;

-- Every job shape is charged: a gang (nodes x gpus whole GPUs), a share of one GPU, one MIG slice.
ALTER TABLE quota_policy_pending
    ADD COLUMN nodes        integer NOT NULL DEFAULT 1,
    ADD COLUMN share_milli  integer,
    ADD COLUMN mig_profile  text;

-- The nominal quota beside the limit, so that readers (metrics) need not parse the tenancy.
ALTER TABLE quota_policy_usage ADD COLUMN nominal_units bigint NOT NULL DEFAULT 0;

-- Tenancy revisions in force, newest last: the file at start-up or an operator's TenancyUpdated. The
-- newest revision is the one every quota process uses; an older or equal revision is never applied.
CREATE TABLE quota_tenancy_revisions (
    revision    integer PRIMARY KEY,
    document    text NOT NULL,
    source      text NOT NULL,
    event_id    uuid UNIQUE,
    applied_at  timestamptz NOT NULL
);

-- Tenancy updates that were not applied, with every reason (bad file, bad credential, stale revision).
CREATE TABLE quota_tenancy_rejections (
    event_id     uuid PRIMARY KEY,
    revision     integer,
    source       text,
    problems     text[] NOT NULL,
    rejected_at  timestamptz NOT NULL
);

-- ReclaimRequested sent to the preemption service (also put in the outbox, in the same transaction). The
-- latest per (tenant, flavor) decides whether a reclaim that is still needed is asked for again.
CREATE TABLE quota_reclaims (
    event_id      uuid PRIMARY KEY,
    tenant        text NOT NULL,
    cohort        text NOT NULL,
    flavor        text NOT NULL,
    units         bigint NOT NULL CHECK (units > 0),
    for_jobs      text[] NOT NULL,
    borrowers     jsonb NOT NULL,
    reason        text NOT NULL,
    requested_at  timestamptz NOT NULL
);
CREATE INDEX quota_reclaims_latest ON quota_reclaims (tenant, flavor, requested_at DESC);
