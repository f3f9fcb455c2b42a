-- Read model of jobs, kept in the same transaction as the job's events (inline projection).
CREATE TABLE jobs (
    job_id        text PRIMARY KEY,
    tenant        text,
    status        text NOT NULL,
    version       integer NOT NULL,
    gpus          integer,
    gpu_model     text,
    priority      integer,
    node_id       text,
    gpu_indices   integer[],
    exit_code     integer,
    reasons       jsonb NOT NULL DEFAULT '[]'::jsonb,
    submitted_at  timestamptz,
    admitted_at   timestamptz,
    queued_at     timestamptz,
    placed_at     timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    updated_at    timestamptz NOT NULL
);
CREATE INDEX jobs_status ON jobs (status);
CREATE INDEX jobs_tenant ON jobs (tenant);

-- Quota ledger: the cap is enforced by the database, so two quota processes cannot both overshoot.
CREATE TABLE quota_ledger (
    tenant         text PRIMARY KEY,
    cap_gpus       integer NOT NULL CHECK (cap_gpus >= 0),
    reserved_gpus  integer NOT NULL DEFAULT 0,
    CHECK (reserved_gpus >= 0 AND reserved_gpus <= cap_gpus)
);
CREATE TABLE quota_pending (
    job_id    text PRIMARY KEY,
    tenant    text NOT NULL,
    gpus      integer NOT NULL,
    priority  integer NOT NULL,
    seq       bigserial,
    last_reason text
);
CREATE INDEX quota_pending_order ON quota_pending (tenant, priority DESC, seq);

-- Inventory and allocations, owned by the placement service.
CREATE TABLE nodes (
    node_id        text PRIMARY KEY,
    hostname       text NOT NULL,
    labels         jsonb NOT NULL DEFAULT '{}'::jsonb,
    cpu_milli      integer NOT NULL,
    memory_mib     bigint NOT NULL,
    nvml_backend   text NOT NULL,
    registered_at  timestamptz NOT NULL,
    last_seen_at   timestamptz NOT NULL
);
CREATE TABLE gpus (
    node_id     text NOT NULL REFERENCES nodes (node_id),
    gpu_index   integer NOT NULL,
    uuid        text NOT NULL,
    model       text NOT NULL,
    memory_mib  integer NOT NULL,
    healthy     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (node_id, gpu_index)
);
-- The primary key is the guarantee that no GPU is ever allocated twice.
CREATE TABLE gpu_allocations (
    node_id       text NOT NULL,
    gpu_index     integer NOT NULL,
    job_id        text NOT NULL,
    allocated_at  timestamptz NOT NULL,
    PRIMARY KEY (node_id, gpu_index),
    FOREIGN KEY (node_id, gpu_index) REFERENCES gpus (node_id, gpu_index)
);
CREATE INDEX gpu_allocations_job ON gpu_allocations (job_id);
CREATE TABLE placement_pending (
    job_id     text PRIMARY KEY,
    tenant     text NOT NULL,
    gpus       integer NOT NULL,
    gpu_model  text,
    priority   integer NOT NULL,
    seq        bigserial,
    last_reasons jsonb
);

-- Preemption: what it looked at and why it did nothing (victim selection is a later issue).
CREATE TABLE preemption_evaluations (
    job_id        text PRIMARY KEY,
    evaluated_at  timestamptz NOT NULL,
    outcome       text NOT NULL,
    reasons       jsonb NOT NULL
);

-- Metrics: cluster utilization samples computed from NVML telemetry.
CREATE TABLE cluster_utilization (
    sampled_at        timestamptz PRIMARY KEY,
    gpus_reporting    integer NOT NULL,
    gpus_busy         integer NOT NULL,
    mean_utilization  double precision NOT NULL
);
