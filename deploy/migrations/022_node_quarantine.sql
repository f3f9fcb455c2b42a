-- A node whose registration cannot describe a real node (GPU indices not 0..n-1, numbers no machine has)
-- is quarantined with the reasons (issue 14): status 'Quarantined', nothing placed there; a valid
-- registration makes it Ready again and clears them.
ALTER TABLE nodes ADD COLUMN quarantine_reasons text[];
ALTER TABLE nodes DROP CONSTRAINT nodes_status_check;
ALTER TABLE nodes ADD CONSTRAINT nodes_status_check CHECK (status IN ('Ready', 'Lost', 'Quarantined'));
