"""Documented store functions: the only way one service reads data another service owns.

- ``cluster``: nodes, GPUs, allocations and nominations (owned by placement; read by preemption) and the
  placement cycle lock every writer of them holds.
- ``tenancy``: the tenancy revision in force (owned by quota; read by admission and preemption).
- ``queue``: the quota queue as the quota cycle orders it (owned by quota; read by the CLI).
"""
