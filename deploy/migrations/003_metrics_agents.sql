-- Metrics: the scaler's hysteresis state (one row), so a restarted metrics service neither repeats nor
-- forgets a scale decision, and the history of decisions with the numbers that justified them.
CREATE TABLE metrics_scaler_state (
    id          smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    state       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE TABLE scale_decisions (
    id          bigserial PRIMARY KEY,
    event_id    uuid NOT NULL UNIQUE,
    decided_at  timestamptz NOT NULL,
    direction   text NOT NULL CHECK (direction IN ('out', 'in')),
    gpu_model   text NOT NULL,
    node_id     text,
    nodes       integer NOT NULL,
    reason      text NOT NULL,
    evidence    jsonb NOT NULL
);
CREATE INDEX scale_decisions_model ON scale_decisions (gpu_model, decided_at);
