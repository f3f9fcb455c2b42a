"""How long a job runs, as far as anyone can tell before it ends: its time limit where it has one; else the
median of its tenant's recent runs of the same shape (the same GPUs in all, the same model asked for); else
the median of every tenant's; else a configured default. A run already past its estimate is given the
median of the past runs that lasted longer than it has; when fewer than ``min_runs`` did, as long again as it
has run (run-times are heavy-tailed: a run that has lasted long is likely to last long); one past its time
limit, ``overdue_s`` (the agent stops it at its limit)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

from .model import EstimateConfig, FinishedRun, RuntimeEstimate, Shape


def _median(values: list[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True)
class RuntimeModel:
    """Finished runs by (tenant, shape key) and by shape key, each list sorted."""

    config: EstimateConfig
    by_tenant: dict[tuple[str, tuple[float, str | None]], list[float]] = field(default_factory=dict)
    by_shape: dict[tuple[float, str | None], list[float]] = field(default_factory=dict)

    @classmethod
    def of(cls, runs: Iterable[FinishedRun], now_s: float, config: EstimateConfig) -> RuntimeModel:
        """The runs that ended in the last ``config.history_s`` before ``now_s`` (none after it)."""
        model = cls(config)
        for run in runs:
            if now_s - config.history_s <= run.finished_at_s <= now_s and run.runtime_s > 0:
                key = (run.total_gpus, run.model)
                model.by_tenant.setdefault((run.tenant, key), []).append(run.runtime_s)
                model.by_shape.setdefault(key, []).append(run.runtime_s)
        for values in (*model.by_tenant.values(), *model.by_shape.values()):
            values.sort()
        return model

    def _sample(self, tenant: str, shape: Shape) -> tuple[list[float], str]:
        key, stat = shape.history_key(), self.config.statistic
        own = self.by_tenant.get((tenant, key), [])
        if len(own) >= self.config.min_runs:
            return own, f"tenant {stat} of {len(own)} runs"
        every = self.by_shape.get(key, [])
        if len(every) >= self.config.min_runs:
            return every, f"{stat} of {len(every)} runs of all tenants"
        return [], "default"

    def _summary(self, sample: list[float]) -> float:
        return _mean(sample) if self.config.statistic == "mean" else _median(sample)

    def estimate(self, tenant: str, shape: Shape, time_limit_s: float | None) -> RuntimeEstimate:
        """The whole run's estimate."""
        if time_limit_s is not None and time_limit_s > 0:
            return RuntimeEstimate(time_limit_s, "time limit")
        sample, source = self._sample(tenant, shape)
        return RuntimeEstimate(self._summary(sample) if sample else self.config.default_runtime_s, source)

    def remaining(self, tenant: str, shape: Shape, time_limit_s: float | None, elapsed_s: float) -> RuntimeEstimate:
        """What is left of a run that has run ``elapsed_s``."""
        whole = self.estimate(tenant, shape, time_limit_s)
        if whole.seconds > elapsed_s:
            return RuntimeEstimate(whole.seconds - elapsed_s, whole.source)
        if whole.source == "time limit":  # the agent stops it at its limit
            return RuntimeEstimate(self.config.overdue_s, "time limit, overdue")
        sample, _ = self._sample(tenant, shape)
        longer = sample[bisect_right(sample, elapsed_s):]
        if len(longer) >= self.config.min_runs:
            return RuntimeEstimate(self._summary(longer) - elapsed_s, f"{whole.source}, of runs longer than it has run")
        # longer than (almost) every run seen: heavy-tailed run-times say it is about halfway through
        return RuntimeEstimate(max(self.config.overdue_s, elapsed_s), f"{whole.source}, overdue: as long again")
