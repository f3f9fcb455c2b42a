"""Builders: ``a_cohort(team("team-a", 16, borrow=8), team("team-b", 8))`` and
``a_job("j1").tenant("team-a").gpus(4).submitted(3).pending()``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusched_core.quota import UNITS_PER_GPU, PendingJob, QuotaAsk, Tenancy, parse_tenancy

A100 = "A100"
CLASSES = {"high": 100, "normal": 10, "low": 0}


def team(name: str, nominal: float, borrow: float | None = None, lend: float | None = None, *,
         weight: float = 1.0, classes: list[str] | None = None, flavor: str = A100) -> dict:
    doc: dict = {"name": name, "weight": weight,
                 "quota": {flavor: {"nominal": nominal, "borrowing_limit": borrow, "lending_limit": lend}}}
    if classes is not None:
        doc["priority_classes"] = classes
    return doc


def org(name: str, *children: dict, borrow: float | None = None, lend: float | None = None,
        flavor: str = A100) -> dict:
    doc: dict = {"name": name, "children": list(children)}
    if borrow is not None or lend is not None:
        doc["quota"] = {flavor: {"borrowing_limit": borrow, "lending_limit": lend}}
    return doc


def a_cohort(*teams: dict, half_life_s: float = 0.0, name: str = "cohort") -> Tenancy:
    return tenancy_of([org(name, *teams)], half_life_s=half_life_s)


def tenancy_of(roots: list[dict], half_life_s: float = 0.0) -> Tenancy:
    return parse_tenancy({"version": 1, "priority_classes": CLASSES, "default_priority_class": "normal",
                          "fair_share": {"half_life_s": half_life_s}, "tenants": roots})


def gpus(n: float) -> int:
    return int(round(n * UNITS_PER_GPU))


@dataclass(frozen=True)
class JobBuilder:
    job_id: str
    _tenant: str = "team-a"
    _gpus: float = 1
    _flavor: str = A100
    _class: str = "normal"
    _submitted: float = 0.0
    _level: int = 0

    def tenant(self, name: str) -> JobBuilder:
        return replace(self, _tenant=name)

    def gpus(self, n: float) -> JobBuilder:
        return replace(self, _gpus=n)

    def flavor(self, name: str) -> JobBuilder:
        return replace(self, _flavor=name)

    def priority(self, name: str) -> JobBuilder:
        return replace(self, _class=name)

    def submitted(self, at_s: float) -> JobBuilder:
        return replace(self, _submitted=at_s)

    def level(self, n: int) -> JobBuilder:
        return replace(self, _level=n)

    def pending(self) -> PendingJob:
        return PendingJob(self.job_id, self._tenant, QuotaAsk(((self._flavor, gpus(self._gpus)),)), self._class,
                          self._submitted, self._level)


def a_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def usage(**per_tenant: float) -> dict[str, dict[str, int]]:
    """``usage(team_a=16)`` -> ``{"team-a": {"A100": 112000}}`` (underscores become dashes)."""
    return {name.replace("_", "-"): {A100: gpus(n)} for name, n in per_tenant.items()}
