-- The outbox relay's leadership, fenced (issue 15): whoever takes a producer's relay takes the next term,
-- and a relay publishes and marks rows only while the term is still its own (a relay that lost its lock
-- without knowing stops at its next batch).
CREATE TABLE relay_terms (
    producer  text PRIMARY KEY,
    term      bigint NOT NULL,
    holder    text NOT NULL,
    since     timestamptz NOT NULL
);

-- A row the broker refuses for good (too large, no such topic) is parked with the error, never retried,
-- and the rows after it go on: `gpusched outbox parked` lists them.
ALTER TABLE outbox ADD COLUMN parked_at timestamptz, ADD COLUMN park_reason text;
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (producer, id) WHERE published_at IS NULL AND parked_at IS NULL;
-- retention: published rows are deleted after a while (the event store keeps the events themselves)
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

-- A dead-lettered message's claim (gpusched_common.batching.remember_dead_lettered) says so: an operator's
-- `gpusched deadletter replay` releases exactly such a claim before sending the message again.
ALTER TABLE inbox ADD COLUMN dead_lettered boolean NOT NULL DEFAULT false;
CREATE INDEX inbox_processed ON inbox (processed_at);
