-- Node commands are re-sent until a report acknowledges them (issue 15): each StartJob placement sends is
-- kept here until the node reports that run started (or the job leaves Placed); a periodic pass sends the
-- unacknowledged ones again (a StartJob lost with a broker, say). The agent runs a run once whatever it is
-- sent: a repeat of a run it has is answered with its start again.
CREATE TABLE placement_starts (
    job_id     text NOT NULL,
    node_id    text NOT NULL,
    attempt    integer NOT NULL,
    payload    jsonb NOT NULL,
    sent_at    timestamptz NOT NULL,
    resends    integer NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, node_id)
);
