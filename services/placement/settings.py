"""The placement service's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpusched_common.settings import Settings


class PlacementSettings(Settings):
    # any name from `gpusched simulate --list-policies` (GPUSCHED_PLACEMENT_POLICY=bestfit: the published baseline)
    placement_policy: str = "ours"
    # c: the placement engine's C kernel computes fragmentation growth where it was built (pip install with a
    # C compiler); numpy: numpy does (the same decisions, about half as fast)
    placement_kernel: Literal["c", "numpy"] = "c"
    # a cycle from the store alone this often, whatever the bus says (it places what a lost message left)
    reconcile_interval_s: float = 5.0
    # the most of its time placement's cycles take while jobs keep coming (``gpusched_common.pacing``): a
    # batch that comes sooner after the last cycle queues its jobs and leaves the cycle due; 1 runs a cycle in
    # every batch that needs one
    placement_cycle_share: float = Field(default=0.5, gt=0.0, le=1.0)
    # GPUs held for a preemptor go back to everyone when it has not been placed on them this long (a job
    # still waiting for quota, say); its victims have stopped long before (preemption_grace_s)
    nomination_ttl_s: float = 300.0
    # a StartJob no node acknowledged (a start report) this long is sent again (services/placement/starts.py)
    start_resend_s: float = 30.0
