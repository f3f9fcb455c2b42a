-- What is held for a preemptor is what it will be placed on (issue 15): a whole GPU, a share of one or a MIG
-- instance. Before, a hold recorded only the GPU, and loading the cluster read it as a whole GPU: a hold on
-- a MIG GPU (a reclaim for a MIG job) made every placement cycle fail from then on. Rows written before
-- this migration keep the defaults (a whole GPU); one that no longer fits is left out when loading.
ALTER TABLE gpu_nominations ADD COLUMN milli integer NOT NULL DEFAULT 1000;
ALTER TABLE gpu_nominations ADD COLUMN memory_mib bigint NOT NULL DEFAULT 0;
ALTER TABLE gpu_nominations ADD COLUMN mig_profile text;
ALTER TABLE gpu_nominations ADD COLUMN mig_start integer;
