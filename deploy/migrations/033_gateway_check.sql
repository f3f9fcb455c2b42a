-- Issue 19 (part 5): POST /v1/jobs:check judges a job on the cluster as placement and preemption load it,
-- without submitting it. Beyond what the gateway reads already (migration 017) that takes the GPUs held for
-- a preemptor (gpusched_common.stores.cluster.load_cluster) and quota's reservations, which say what each
-- running job is charged (gpusched_common.stores.running.load_running). Reads only, like every gateway grant.
GRANT SELECT ON gpu_nominations, quota_policy_reservations TO gpusched_gateway;
