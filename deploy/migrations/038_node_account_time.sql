-- When the store recorded each node's account of its jobs (its latest heartbeat's running_jobs, migration
-- 028), by placement's clock: placement's drift pass judges a job against a node's account only when the
-- store's own record of that job is older than the account (issue 16). A job whose start was recorded after
-- the heartbeat was (heartbeats come every 10 s, the drift window is 10 s) is not missing from it, and a job
-- that ended after it is not run unexpectedly: at 1,000 simulated nodes such stale accounts made placement
-- reconcile nodes that had drifted from nothing.
ALTER TABLE nodes ADD COLUMN reported_at timestamptz;
