-- Issue 17: what the dashboard reads (GET /v1/cluster, /v1/history) that lived only in the metrics
-- service's memory, kept by the metrics service on its sampling cycle (services/metrics/store.py):
--   gpu_telemetry:  the latest NVML reading of each GPU (one multi-row upsert per cycle);
--   usage_samples:  per cycle, per tenant and GPU model, the GPUs its jobs held (a share or a MIG instance
--                   counts as its milli / 1000) and how many of them were busy; pruned after
--                   GPUSCHED_METRICS_USAGE_RETENTION_S (14 days by default), like cluster_utilization.
CREATE TABLE gpu_telemetry (
    node_id          text NOT NULL,
    gpu_index        integer NOT NULL,
    utilization_pct  double precision NOT NULL,
    memory_used_mib  bigint NOT NULL,
    healthy          boolean NOT NULL,
    sampled_at       timestamptz NOT NULL,
    PRIMARY KEY (node_id, gpu_index)
);
CREATE TABLE usage_samples (
    sampled_at            timestamptz NOT NULL,
    tenant                text NOT NULL,
    gpu_model             text NOT NULL,
    allocated_gpus        double precision NOT NULL CHECK (allocated_gpus >= 0),
    busy_gpus             double precision NOT NULL CHECK (busy_gpus >= 0),
    mean_utilization_pct  double precision,
    PRIMARY KEY (sampled_at, tenant, gpu_model)
);
CREATE INDEX usage_samples_tenant ON usage_samples (tenant, sampled_at);

-- the history view's two reads of shared tables, by time: jobs placed in a window, preemptions in a window
CREATE INDEX jobs_placed_at ON jobs (placed_at) WHERE placed_at IS NOT NULL;
CREATE INDEX events_preempted_at ON events (occurred_at) WHERE type = 'JobPreempted';

-- The gateway (migration 017's role) reads both, and the sampling instants of cluster_utilization (a cycle
-- in which no tenant held a GPU writes no usage_samples row, but still counts in a bucket's average).
GRANT SELECT ON gpu_telemetry, usage_samples, cluster_utilization TO gpusched_gateway;
