-- placement_version (migration 012) moved on for every statement on the cluster's tables, also for a
-- statement that changed no row: the reconcile pass's DELETE of expired nominations (none, nearly always)
-- made every placement process load the whole cluster again every few seconds. Row triggers fire only for
-- rows a statement changed, and the version moves once per transaction: a reader only ever compares the
-- versions of committed states, and the version row stays locked by the transaction until it ends. The
-- mark is a setting local to the transaction, undone with a rolled-back savepoint like the update itself.
CREATE FUNCTION placement_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('gpusched.placement_version_moved', true) IS DISTINCT FROM 'on' THEN
        UPDATE placement_version SET version = nextval('placement_version_seq');
        PERFORM set_config('gpusched.placement_version_moved', 'on', true);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER gpu_allocations_version ON gpu_allocations;
DROP TRIGGER gpu_nominations_version ON gpu_nominations;
DROP TRIGGER gpus_version ON gpus;
DROP TRIGGER nodes_version ON nodes;
DROP TRIGGER nodes_cordon_version ON nodes;
DROP FUNCTION placement_changed();

CREATE TRIGGER gpu_allocations_version AFTER INSERT OR UPDATE OR DELETE ON gpu_allocations
    FOR EACH ROW EXECUTE FUNCTION placement_row_changed();
CREATE TRIGGER gpu_nominations_version AFTER INSERT OR UPDATE OR DELETE ON gpu_nominations
    FOR EACH ROW EXECUTE FUNCTION placement_row_changed();
CREATE TRIGGER gpus_version AFTER INSERT OR UPDATE OR DELETE ON gpus
    FOR EACH ROW EXECUTE FUNCTION placement_row_changed();
-- heartbeats update nodes every few seconds (last_seen_at, lease): only what placement reads counts
CREATE TRIGGER nodes_version AFTER INSERT OR DELETE OR UPDATE OF status, labels, cpu_milli, memory_mib, cordoned_at
    ON nodes FOR EACH ROW EXECUTE FUNCTION placement_row_changed();
