"""The dashboard's documents (pure): plain rows in, JSON-ready dicts out; no I/O, clock or randomness
(``now`` is an argument).

- `cluster`: ``plan_cluster`` - every node and GPU with its state, allocations and latest telemetry; per
  model totals; fragmentation; how many jobs of the common shapes fit now (GET /v1/cluster).
- `history`: ``plan_history`` - usage series bucketed over a window, submit->placed waits (nearest-rank
  percentiles, a histogram), preemptions per bucket (GET /v1/history); ``plan_window`` checks a window.
- `usage`: ``plan_usage_samples`` - per tenant and model, what its jobs hold and how busy it is (the metrics
  service's sampling cycle writes these as ``usage_samples``).
- `tenants`: ``plan_tenants`` - each tenant's cohort, weight, fair share, decayed usage, pending work and
  flavors; each cohort's totals (GET /v1/tenants).
"""

from .cluster import AllocationRow, GpuRow, NodeRow, TelemetryRow, plan_cluster
from .history import HistoryWindow, WaitRow, WindowError, percentile, plan_history, plan_window
from .tenants import PendingRow, plan_tenants
from .usage import ShareRow, UsageSample, plan_usage_samples

__all__ = ["AllocationRow", "GpuRow", "HistoryWindow", "NodeRow", "PendingRow", "ShareRow", "TelemetryRow",
           "UsageSample", "WaitRow", "WindowError", "percentile", "plan_cluster", "plan_history",
           "plan_tenants", "plan_usage_samples", "plan_window"]
