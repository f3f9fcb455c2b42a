-- The stream id of a job's events, for queries that join a job to its stream: the SQL twin of
-- gpusched_common.ids.job_stream (tests/integration/test_sql_guards.py keeps the two equal). IMMUTABLE
-- and plain SQL, so PostgreSQL inlines it and `stream_id = job_stream(j.job_id)` still uses the index.
CREATE FUNCTION job_stream(job_id text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 'job-' || job_id $$;
