-- GPUs nominated for a preemptor while its victims stop: no third job may take them in the meantime.
CREATE TABLE gpu_nominations (
    node_id       text NOT NULL,
    gpu_index     integer NOT NULL,
    job_id        text NOT NULL,   -- the preemptor
    nominated_at  timestamptz NOT NULL,
    PRIMARY KEY (node_id, gpu_index),
    FOREIGN KEY (node_id, gpu_index) REFERENCES gpus (node_id, gpu_index)
);
CREATE INDEX gpu_nominations_job ON gpu_nominations (job_id);
