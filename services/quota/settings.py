"""The quota service's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpusched_common.settings import FairShareSettings


class QuotaSettings(FairShareSettings):  # and its fair backfill
    # the tenancy tree (deploy/tenants.example.yaml): put in force at start when newer than the revision in
    # PostgreSQL (operators publish later ones with `gpusched tenants apply`); required on a fresh database
    tenants_file: Path | None = None
    quota_reclaim_cooldown_s: float = 300.0  # a reclaim of borrowed quota still needed is asked again after this
    # a cycle from the store alone this often, whatever the bus says (it reserves what a lost message left)
    reconcile_interval_s: float = 5.0
    # the most of its time a cohort's cycles take while its jobs keep coming (``pacing``): a batch that comes
    # sooner queues its jobs and leaves the cycle due; 1 runs a cycle in every batch
    quota_cycle_share: float = Field(default=0.5, gt=0.0, le=1.0)
