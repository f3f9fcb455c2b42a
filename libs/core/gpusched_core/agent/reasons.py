"""The reason codes a node agent puts on the exits it reports (`JobExitReported.reason_code`).

Placement and the job's history read them; the values are part of the message format, so they never
change.
"""

from __future__ import annotations

LEASE_LOST = "lease_lost"  # the node's lease lapsed: the agent fenced the job (or refused to start it)
NOT_ASSIGNED = "not_assigned"  # the store no longer expects the job on this node (never reported)
MISSING = "missing_after_restart"  # the store expects a job the agent does not have: requeue it
GPU_UNHEALTHY = "gpu_unhealthy"  # a GPU of the job failed (or was already cordoned when it was to start)
STOPPED = "stopped"  # a StopJob (e.g. the job was cancelled)
PREEMPTED = "preempted"  # a PreemptJob: notice, grace period, then SIGKILL
