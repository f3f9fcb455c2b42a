-- Preemption: jobs preempted to return borrowed quota to a tenant (issue 5), per blocked job. A repeated
-- reclaim request counts what these still give back instead of preempting more; one made before their
-- quota went back (QuotaReleased after `version` on the victim's stream) is stale.
CREATE TABLE reclaim_victims (
    victim_job_id  text NOT NULL,
    version        integer NOT NULL,   -- the victim's stream version at its PreemptionRequested
    for_job_id     text NOT NULL,      -- the blocked job of the tenant under its nominal quota
    flavor         text NOT NULL,
    units          bigint NOT NULL CHECK (units >= 0),   -- quota units it held (7000 per GPU)
    requested_at   timestamptz NOT NULL,
    PRIMARY KEY (victim_job_id, version)
);
CREATE INDEX reclaim_victims_for_job ON reclaim_victims (for_job_id);
