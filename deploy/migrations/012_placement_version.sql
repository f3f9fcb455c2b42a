-- A version of everything a placement cycle reads about the cluster (nodes, GPUs, allocations,
-- nominations), so a placement process can keep its snapshot between cycles and load it again only when
-- someone else changed the cluster. Each change takes a fresh value from a sequence: a rolled-back change
-- never hands out a value that a later, different state could share.
--
-- Writers of these tables hold placement's cycle lock (an advisory lock) first, so the version row is
-- always taken after that lock and the version a cycle reads at its end covers exactly its own writes.
CREATE SEQUENCE placement_version_seq;
CREATE TABLE placement_version (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    version  bigint NOT NULL
);
INSERT INTO placement_version (one, version) VALUES (true, nextval('placement_version_seq'));

CREATE FUNCTION placement_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE placement_version SET version = nextval('placement_version_seq');
    RETURN NULL;
END $$;

CREATE TRIGGER gpu_allocations_version AFTER INSERT OR UPDATE OR DELETE ON gpu_allocations
    FOR EACH STATEMENT EXECUTE FUNCTION placement_changed();
CREATE TRIGGER gpu_nominations_version AFTER INSERT OR UPDATE OR DELETE ON gpu_nominations
    FOR EACH STATEMENT EXECUTE FUNCTION placement_changed();
CREATE TRIGGER gpus_version AFTER INSERT OR UPDATE OR DELETE ON gpus
    FOR EACH STATEMENT EXECUTE FUNCTION placement_changed();
-- heartbeats update nodes every few seconds (last_seen_at, lease): only what placement reads counts
CREATE TRIGGER nodes_version AFTER INSERT OR DELETE OR UPDATE OF status, labels, cpu_milli, memory_mib ON nodes
    FOR EACH STATEMENT EXECUTE FUNCTION placement_changed();
