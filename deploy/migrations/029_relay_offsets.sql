-- A broker that lost its data (Tansu restarted, a Kafka log wiped) is noticed by each relay (issue 15): the
-- broker acknowledges a row at an offset below one it acknowledged before on that partition. The highest
-- acknowledged offset per partition is kept with the relay's term, so a relay that takes over notices too;
-- the relay then publishes again what it published within GPUSCHED_OUTBOX_REPUBLISH_S (consumers dedupe).
ALTER TABLE relay_terms ADD COLUMN high_offsets jsonb NOT NULL DEFAULT '{}';
