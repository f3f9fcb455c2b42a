-- When quota last recorded a waiting job's reason (issue 16): a reason whose only change is its figures
-- (a tenant's usage moving while thousands of its jobs wait) is recorded again at most every so often, not
-- once per job per cycle; a reason that changes in kind is recorded at once.
ALTER TABLE quota_policy_pending ADD COLUMN last_reason_at_s double precision;
