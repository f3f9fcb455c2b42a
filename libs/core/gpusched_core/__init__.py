"""gpusched's pure decision cores, shared by the live services and the simulators (ARCHITECTURE.md).

- `lifecycle`: a job's states and the commands that move it (the decider every service appends through).
- `placement`: node/GPU choice for whole GPUs, gangs, MIG slices and shares; fragmentation scores; the
  placement cycle over pending jobs, what a placement holds and tells the agents; node leases; MIG geometry.
- `quota`: the tenancy, the usage ledger, fair-share ordering, the quota cycle's plan, reclaim requests and
  queue positions.
- `preemption`: victim selection for priority preemption and quota reclaims.
- `metrics`: utilisation views and the scaler.
- `agent`: what a node agent does with a StartJob, a preemption, a GPU fault and a reconcile.
- `access`: who may do what (`authorize(principal, action, resource)`), for the gateway to come.

Rules (checked by tests/unit/test_core_purity.py): a core module imports only the standard library,
numpy, pydantic, yaml, other cores and the wire contract (`gpusched_common.events`, `.resources`, `.ids`,
`.identity`); never a service, a broker or database client, nor a clock or a random source. Time and ids
come in as arguments, and every ordering ends in a total tie-break.
"""
