-- Node leases, owned by placement: a node whose agent stops heartbeating is declared lost once, its jobs
-- requeued, and reports from the lost epoch are ignored afterwards (the agent fences itself before that).
ALTER TABLE nodes
    ADD COLUMN lease_epoch    bigint NOT NULL DEFAULT 0,
    ADD COLUMN lease_ttl_s    double precision NOT NULL DEFAULT 0,
    ADD COLUMN fence_grace_s  double precision NOT NULL DEFAULT 0,
    ADD COLUMN lost_epoch     bigint,
    ADD COLUMN status         text NOT NULL DEFAULT 'Ready' CHECK (status IN ('Ready', 'Lost'));
