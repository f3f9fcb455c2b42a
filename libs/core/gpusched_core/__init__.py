"""gpusched's pure decision cores, shared by the live services and the simulators.

- `placement`: node/GPU choice for whole GPUs, gangs, MIG slices and shares; fragmentation scores.
- `quota`: the tenancy, the usage ledger, fair-share ordering and the quota cycle's plan.
- `preemption`: victim selection for priority preemption and quota reclaims.

Rules (checked by tests/unit/test_core_purity.py): a core module imports only the standard library,
numpy, pydantic, yaml and other cores; never a service, a broker or database client, nor a clock or a
random source. Time and ids come in as arguments, and every ordering ends in a total tie-break.
"""
