-- Job arrays (issue 13): a waiting task knows its array and cap, a reservation its array, so that quota
-- counts an array's tasks holding quota and offers no more than the cap allows to a reservation cycle.
ALTER TABLE quota_policy_pending
    ADD COLUMN array_id           text,
    ADD COLUMN array_index        integer,
    ADD COLUMN array_max_running  integer CHECK (array_max_running IS NULL OR array_max_running > 0);
ALTER TABLE quota_policy_reservations ADD COLUMN array_id text;
CREATE INDEX quota_policy_reservations_array ON quota_policy_reservations (array_id) WHERE array_id IS NOT NULL;

-- Job dependencies (issue 13): an admitted job waiting for others to end (--after JOB[:ok|:any]) is kept
-- out of quota's queue; one row per dependency not yet ended, found again when that job ends.
CREATE TABLE quota_job_dependencies (
    job_id      text NOT NULL,
    depends_on  text NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX quota_job_dependencies_on ON quota_job_dependencies (depends_on);
