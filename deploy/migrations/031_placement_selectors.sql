-- Issue 18: a job may name node labels (Kubernetes' nodeSelector and required node affinity) and an image
-- (a container runtime label on the node): what a waiting job needs of its nodes, as label pairs. Rows
-- queued before this migration need nothing.
ALTER TABLE placement_pending ADD COLUMN node_selector jsonb NOT NULL DEFAULT '{}'::jsonb;
