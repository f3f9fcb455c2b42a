-- Quota orders waiting work by submission time (events of different jobs arrive from different
-- partitions, so arrival order at the quota service is not submission order).
ALTER TABLE quota_pending ADD COLUMN submitted_at timestamptz;
ALTER TABLE placement_pending ADD COLUMN submitted_at timestamptz;
