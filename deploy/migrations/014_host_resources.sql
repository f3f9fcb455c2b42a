-- Host CPU and memory a job asks for on each of its nodes (JobSpec.cpu_milli / memory_mib), held while it
-- holds GPUs there.
--
-- What a job holds on a node is carried by its first gpu_allocations row on that node (the lowest GPU
-- index; its other rows carry 0), so every path that gives GPUs back gives the host resources back with
-- them. A trigger keeps host_usage per node, CHECKed against the node's capacity as it was when the job
-- was placed; the row is updated in place, so two writers on one node serialise on it and the second
-- sees the first's charge (as gpu_usage does for GPUs, migration 009).

ALTER TABLE placement_pending ADD COLUMN cpu_milli integer NOT NULL DEFAULT 0;
ALTER TABLE placement_pending ADD COLUMN memory_mib bigint NOT NULL DEFAULT 0;

ALTER TABLE gpu_allocations ADD COLUMN host_cpu_milli integer NOT NULL DEFAULT 0 CHECK (host_cpu_milli >= 0);
ALTER TABLE gpu_allocations ADD COLUMN host_memory_mib bigint NOT NULL DEFAULT 0 CHECK (host_memory_mib >= 0);

CREATE TABLE host_usage (
    node_id          text PRIMARY KEY REFERENCES nodes (node_id),
    cpu_milli        bigint NOT NULL DEFAULT 0,
    memory_mib       bigint NOT NULL DEFAULT 0,
    cpu_capacity     bigint NOT NULL,
    memory_capacity  bigint NOT NULL,
    CONSTRAINT host_usage_cpu_within_node CHECK (cpu_milli BETWEEN 0 AND cpu_capacity),
    CONSTRAINT host_usage_memory_within_node CHECK (memory_mib BETWEEN 0 AND memory_capacity)
);

CREATE FUNCTION host_allocation_charge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.host_cpu_milli > 0 OR NEW.host_memory_mib > 0 THEN
            INSERT INTO host_usage AS u (node_id, cpu_milli, memory_mib, cpu_capacity, memory_capacity)
            SELECT NEW.node_id, NEW.host_cpu_milli, NEW.host_memory_mib, n.cpu_milli, n.memory_mib
              FROM nodes n WHERE n.node_id = NEW.node_id
            ON CONFLICT (node_id) DO UPDATE
               SET cpu_milli = u.cpu_milli + EXCLUDED.cpu_milli, memory_mib = u.memory_mib + EXCLUDED.memory_mib,
                   cpu_capacity = EXCLUDED.cpu_capacity, memory_capacity = EXCLUDED.memory_capacity;
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.host_cpu_milli > 0 OR OLD.host_memory_mib > 0 THEN
        UPDATE host_usage SET cpu_milli = cpu_milli - OLD.host_cpu_milli, memory_mib = memory_mib - OLD.host_memory_mib
         WHERE node_id = OLD.node_id;
    END IF;
    RETURN OLD;
END $$;

CREATE TRIGGER gpu_allocations_host_charge AFTER INSERT OR DELETE ON gpu_allocations
    FOR EACH ROW EXECUTE FUNCTION host_allocation_charge();
