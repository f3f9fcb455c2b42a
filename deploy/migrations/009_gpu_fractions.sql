-- Fractions of a GPU and gangs, live (issue 3).
--
-- gpu_allocations now holds one row per (GPU, job): a whole GPU (milli 1000), a share (milli < 1000 and
-- memory) or a MIG instance (its memory slices from mig_start). PostgreSQL itself keeps every GPU within
-- capacity, whichever process writes, through two guards maintained by triggers on gpu_allocations:
--   gpu_usage:     per GPU, the milli and share memory allocated, CHECKed against 1000 and the GPU's
--                  memory (the row is updated in place, so two writers of one GPU serialise on it and
--                  the second sees the first's charge);
--   mig_slices:    one row per occupied memory slice of a MIG GPU; its primary key refuses overlap.
-- A MIG instance also charges milli (its share of the 8 memory slices, at least 1), so a whole-GPU
-- allocation can never coexist with a slice or a share on the same GPU.

ALTER TABLE gpus ADD COLUMN mig_enabled boolean NOT NULL DEFAULT false;
ALTER TABLE gpus ADD COLUMN nvlink_domain text;

ALTER TABLE gpu_allocations ADD COLUMN milli integer NOT NULL DEFAULT 1000 CHECK (milli BETWEEN 1 AND 1000);
ALTER TABLE gpu_allocations ADD COLUMN memory_mib integer NOT NULL DEFAULT 0 CHECK (memory_mib >= 0);
ALTER TABLE gpu_allocations ADD COLUMN mig_profile text;
ALTER TABLE gpu_allocations ADD COLUMN mig_start integer;
ALTER TABLE gpu_allocations ADD COLUMN mig_memory_slices integer;
ALTER TABLE gpu_allocations ADD CONSTRAINT gpu_allocations_mig_shape CHECK (
    (mig_profile IS NULL AND mig_start IS NULL AND mig_memory_slices IS NULL)
    OR (mig_profile IS NOT NULL AND mig_start BETWEEN 0 AND 7 AND mig_memory_slices BETWEEN 1 AND 8
        AND mig_start + mig_memory_slices <= 8));
ALTER TABLE gpu_allocations DROP CONSTRAINT gpu_allocations_pkey;
ALTER TABLE gpu_allocations ADD PRIMARY KEY (node_id, gpu_index, job_id);

CREATE TABLE gpu_usage (
    node_id        text NOT NULL,
    gpu_index      integer NOT NULL,
    milli          integer NOT NULL DEFAULT 0,
    memory_mib     bigint NOT NULL DEFAULT 0,
    capacity_mib   bigint NOT NULL,
    PRIMARY KEY (node_id, gpu_index),
    FOREIGN KEY (node_id, gpu_index) REFERENCES gpus (node_id, gpu_index),
    CONSTRAINT gpu_usage_milli_within_gpu CHECK (milli BETWEEN 0 AND 1000),
    CONSTRAINT gpu_usage_memory_within_gpu CHECK (memory_mib BETWEEN 0 AND capacity_mib)
);

CREATE TABLE mig_slices (
    node_id    text NOT NULL,
    gpu_index  integer NOT NULL,
    slice      integer NOT NULL CHECK (slice BETWEEN 0 AND 7),
    job_id     text NOT NULL,
    PRIMARY KEY (node_id, gpu_index, slice)
);

CREATE FUNCTION gpu_allocation_charge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO gpu_usage AS u (node_id, gpu_index, milli, memory_mib, capacity_mib)
        SELECT NEW.node_id, NEW.gpu_index, NEW.milli, NEW.memory_mib, g.memory_mib
          FROM gpus g WHERE g.node_id = NEW.node_id AND g.gpu_index = NEW.gpu_index
        ON CONFLICT (node_id, gpu_index) DO UPDATE
           SET milli = u.milli + EXCLUDED.milli, memory_mib = u.memory_mib + EXCLUDED.memory_mib;
        IF NEW.mig_profile IS NOT NULL THEN
            INSERT INTO mig_slices (node_id, gpu_index, slice, job_id)
            SELECT NEW.node_id, NEW.gpu_index, s, NEW.job_id
              FROM generate_series(NEW.mig_start, NEW.mig_start + NEW.mig_memory_slices - 1) AS s;
        END IF;
        RETURN NEW;
    END IF;
    UPDATE gpu_usage SET milli = milli - OLD.milli, memory_mib = memory_mib - OLD.memory_mib
     WHERE node_id = OLD.node_id AND gpu_index = OLD.gpu_index;
    IF OLD.mig_profile IS NOT NULL THEN
        DELETE FROM mig_slices WHERE node_id = OLD.node_id AND gpu_index = OLD.gpu_index AND job_id = OLD.job_id;
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER gpu_allocations_charge AFTER INSERT OR DELETE ON gpu_allocations
    FOR EACH ROW EXECUTE FUNCTION gpu_allocation_charge();

-- allocations made before this migration
INSERT INTO gpu_usage (node_id, gpu_index, milli, memory_mib, capacity_mib)
SELECT a.node_id, a.gpu_index, sum(a.milli), sum(a.memory_mib), max(g.memory_mib)
  FROM gpu_allocations a JOIN gpus g USING (node_id, gpu_index) GROUP BY a.node_id, a.gpu_index;

-- what placement waits to place: the job's whole request shape
ALTER TABLE placement_pending ADD COLUMN nodes integer NOT NULL DEFAULT 1;
ALTER TABLE placement_pending ADD COLUMN share_milli integer;
ALTER TABLE placement_pending ADD COLUMN share_memory_mib integer;
ALTER TABLE placement_pending ADD COLUMN mig_profile text;
