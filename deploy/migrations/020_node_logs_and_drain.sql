-- Where a node's agent serves its jobs' logs to the gateway (NodeRegistered.log_url; None: it serves none).
ALTER TABLE nodes ADD COLUMN log_url text;

-- A drain asked by an operator (issue 13): the node is cordoned and its jobs preempted through the
-- checkpoint protocol; it shows Drained once nothing runs there. An uncordon ends the drain.
ALTER TABLE nodes ADD COLUMN drain_requested_at timestamptz;
