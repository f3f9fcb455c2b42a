"""The preemption service's settings (environment prefix GPUSCHED_), on top of what every process shares,
and the policy its handlers decide with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from gpusched_common.settings import FairShareSettings

from gpusched_core import preemption as sel


@dataclass(frozen=True)
class PreemptionPolicy:
    """``fair_margin``: fair-share preemption's margin (None: off); ``fair_quantum_s``: runs younger than this
    lose nothing to it (``gpusched_core.preemption.fairshare``)."""

    grace_s: float
    config: sel.SelectionConfig
    fair_margin: float | None = None
    fair_quantum_s: float = 600.0


class PreemptionSettings(FairShareSettings):  # and fair-share preemption
    # the victims' checkpoint grace, how long a (re)started run is protected, and whether a higher-priority
    # job may preempt another tenant's work always ("any") or only borrowed capacity
    preemption_grace_s: float = 30.0
    preemption_min_runtime_s: float = 60.0
    preemption_cross_tenant: Literal["any", "borrowing-only"] = "any"
    # the jobs placement deferred are weighed again this often: runs protected when a job was deferred (the
    # minimum run time, fair share's quantum) may be preempted once they are old enough
    preemption_reconsider_s: float = Field(default=30.0, gt=0.0)

    def policy(self) -> PreemptionPolicy:
        return PreemptionPolicy(
            grace_s=self.preemption_grace_s,
            config=sel.SelectionConfig(default_min_runtime_s=self.preemption_min_runtime_s,
                                       cross_tenant=self.preemption_cross_tenant),
            fair_margin=self.preemption_margin, fair_quantum_s=self.fair_share_quantum_s)
