"""The quota service's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpusched_common.settings import Settings


class QuotaSettings(Settings):
    # the tenancy tree (deploy/tenants.example.yaml): put in force at start when newer than the revision in
    # PostgreSQL (operators publish later ones with `gpusched tenants apply`); required on a fresh database
    tenants_file: Path | None = None
    quota_reclaim_cooldown_s: float = 300.0
    # fair backfill: while a job quota reserved waits for room on the nodes, no other tenant of its cohort gets
    # quota for a job that takes its fair share past (1 + margin) x the waiting tenant's (the share at which
    # that job could preempt it); off: every job that fits quota is reserved, whoever waits for room
    quota_fair_backfill: bool = True
    quota_fair_margin: float = Field(default=0.5, ge=0.0)  # a reclaim of borrowed quota still needed is asked again after this
    # a cycle from the store alone this often, whatever the bus says (it reserves what a lost message left)
    reconcile_interval_s: float = 5.0
    # the most of its time a cohort's cycles take while its jobs keep coming (``pacing``): a batch that comes
    # sooner queues its jobs and leaves the cycle due; 1 runs a cycle in every batch
    quota_cycle_share: float = Field(default=0.5, gt=0.0, le=1.0)
