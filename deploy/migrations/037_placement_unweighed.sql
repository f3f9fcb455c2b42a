-- The jobs of placement's queue no cycle has weighed yet (issue 16): a job gets its reasons when a cycle first
-- defers it, so those without are the ones that came since. While the cluster stands as this placement
-- process's last cycle left it, the jobs that cycle deferred still find no room, and a cycle reads only these.
CREATE INDEX placement_pending_unweighed ON placement_pending (seq) WHERE last_reasons IS NULL;
