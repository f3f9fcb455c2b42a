-- Node identity (issue 14, gpusched_common.node_keys): operators' join tokens and the keys nodes enrol
-- with them. A token's secret is an Ed25519 private key the store never sees (only its public half);
-- a node's key likewise. A node has at most one live key: a token lets new nodes in, never lets anyone
-- speak for a node already enrolled (its key is revoked first).
CREATE TABLE join_tokens (
    token_id     text PRIMARY KEY CHECK (token_id ~ '^[0-9a-f]{16}$'),
    public_key   bytea NOT NULL CHECK (octet_length(public_key) = 32),
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL,
    created_by   text NOT NULL,
    expires_at   timestamptz,  -- NULL: never
    revoked_at   timestamptz,
    enrolled     integer NOT NULL DEFAULT 0  -- nodes enrolled with it
);

CREATE TABLE node_keys (
    key_id       text PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{16}$'),
    node_id      text NOT NULL,
    public_key   bytea NOT NULL CHECK (octet_length(public_key) = 32),
    token_id     text NOT NULL REFERENCES join_tokens (token_id),
    enrolled_at  timestamptz NOT NULL,
    revoked_at   timestamptz,
    revoked_by   text
);
CREATE UNIQUE INDEX node_keys_one_live_key ON node_keys (node_id) WHERE revoked_at IS NULL;

-- Messages a receiver refused (gpusched_common.senders): one counter per receiver, topic, reason and
-- claimed sender (a known key's node, else '-'), so a flood of forgeries adds to a counter, not rows.
CREATE TABLE refused_messages (
    receiver     text NOT NULL,
    topic        text NOT NULL,
    reason       text NOT NULL,
    sender       text NOT NULL,
    refused      bigint NOT NULL,
    first_at     timestamptz NOT NULL,
    last_at      timestamptz NOT NULL,
    last_detail  text NOT NULL,
    PRIMARY KEY (receiver, topic, reason, sender)
);
