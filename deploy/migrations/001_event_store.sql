-- Event store: one row per event; streams with optimistic concurrency; a global order readers can follow.
CREATE TABLE events (
    global_position bigserial PRIMARY KEY,
    -- the writing transaction; readers only read below the oldest running transaction (see store.py)
    transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
    stream_id       text NOT NULL,
    version         integer NOT NULL CHECK (version >= 1),
    event_id        uuid NOT NULL UNIQUE,
    type            text NOT NULL,
    schema_version  integer NOT NULL,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    producer        text NOT NULL,
    tenant          text,
    traceparent     text,
    payload         jsonb NOT NULL,
    UNIQUE (stream_id, version)   -- a stream never forks: two writers of the same version, one wins
);
CREATE INDEX events_transaction_order ON events (transaction_id, global_position);

-- Transactional outbox: written in the same transaction as the events, published by a relay.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    producer      text NOT NULL,
    topic         text NOT NULL,
    key           text NOT NULL,
    headers       jsonb NOT NULL DEFAULT '{}'::jsonb,
    value         bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at  timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (producer, id) WHERE published_at IS NULL;

-- Inbox: event ids a consumer has already applied; redelivery of one of them changes nothing.
CREATE TABLE inbox (
    consumer      text NOT NULL,
    event_id      text NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, event_id)
);
