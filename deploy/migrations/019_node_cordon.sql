-- Cordoned nodes (issue 13): an operator takes a node out of service for new work; what runs there goes on.
-- Placement reads only uncordoned Ready nodes (gpusched_common.stores.cluster.load_cluster); a cordon
-- changes what a placement cycle reads, so it bumps placement_version like the other node columns do.
ALTER TABLE nodes ADD COLUMN cordoned_at timestamptz, ADD COLUMN cordoned_by text, ADD COLUMN cordon_reason text;

CREATE TRIGGER nodes_cordon_version AFTER UPDATE OF cordoned_at ON nodes
    FOR EACH STATEMENT EXECUTE FUNCTION placement_changed();
