-- quota_policy_history.geq_s held each tenant's decayed GPU-equivalent seconds per flavor as a JSON
-- *string* (the object encoded twice); store the object itself, so SQL can read it (geq_s->>'A100-80GB').
UPDATE quota_policy_history SET geq_s = (geq_s #>> '{}')::jsonb WHERE jsonb_typeof(geq_s) = 'string';
ALTER TABLE quota_policy_history ADD CONSTRAINT quota_policy_history_geq_s_object
    CHECK (jsonb_typeof(geq_s) = 'object');
