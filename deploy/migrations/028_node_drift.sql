-- What each node says it runs (its latest heartbeat's running_jobs), compared with the store by placement's
-- periodic pass (issue 15): a node that runs a job the store no longer puts there (a StopJob lost), or
-- lacks a started job the store still expects (its exit report lost), for longer than the drift window is
-- sent a ReconcileJobs of its current epoch, at most once per resend interval. The pass keeps its own
-- state in node_drift (never in nodes, whose rows heartbeats lock: the pass runs under the cycle lock).
ALTER TABLE nodes ADD COLUMN reported_jobs text[];
CREATE TABLE node_drift (
    node_id        text PRIMARY KEY,
    drift_since    timestamptz,
    reconciled_at  timestamptz
);
