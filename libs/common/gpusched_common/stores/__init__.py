"""Documented store functions: the only way one service reads data another service owns.

- ``cluster``: nodes, GPUs, allocations, nominations and placement's queue (owned by placement; read by
  preemption, metrics and the CLI; preemption also nominates GPUs) and the placement cycle lock every
  writer of them holds.
- ``tenancy``: the tenancy revision in force (owned by quota; read by admission and preemption).
- ``quota``: usage, history, the queue and where each job stands, reservations (owned by quota; read by
  the CLI, the metrics and the preemption services).
- ``metrics``: the utilisation samples (owned by metrics; read by the CLI's summary).
- ``running``: who holds GPUs and what quota charges them (placement's and quota's tables; read by
  preemption).
- ``whatif``: the jobs submitted in a window and today's nodes (the jobs read model, placement's nodes;
  read by the gateway's POST /v1/whatif).
"""
