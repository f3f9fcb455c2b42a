-- The gateway's own role (services/gateway, GPUSCHED_GATEWAY_DATABASE_URL): it reads the read models it serves
-- and records a token's use (api_tokens.last_used_at), nothing else; submissions go to Kafka, not here. NOLOGIN
-- and no password in a migration: gpusched_common.db_roles.enable_login gives it LOGIN and a password.
-- Roles are cluster-wide and every database of a server runs this file, so it is created only if missing.
-- A new gateway read (services/gateway/store.py and the gpusched_common.stores it calls) needs its GRANT
-- here (tests/integration/test_gateway_role.py drives every route as this role). What PUBLIC has by
-- default (TEMP, EXECUTE on functions) is left as it is.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'gpusched_gateway') THEN
        CREATE ROLE gpusched_gateway NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- another database's migration created it meanwhile
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO gpusched_gateway', current_database());
END
$$;
GRANT USAGE ON SCHEMA public TO gpusched_gateway;

-- jobs and events: the jobs views and a job's history; the placement and quota queues, the tenancy in force
-- and quota's usage: the queue and tenants views (gpusched_common.stores.jobs.waiting_jobs, stores.quota);
-- nodes, GPUs and allocations: the nodes view (stores.cluster.node_inventory)
GRANT SELECT ON jobs, events, placement_pending, quota_policy_pending, quota_policy_usage, quota_policy_history,
    quota_tenancy_revisions, nodes, gpus, gpu_allocations TO gpusched_gateway;
-- gpusched_common.tokens.verify: read the token's row, record its use (that one column only)
GRANT SELECT, UPDATE (last_used_at) ON api_tokens TO gpusched_gateway;
