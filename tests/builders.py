"""Test builders: `a_job("j1").tenant("t1").gpus(4).spec()` and friends."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from gpusched_common import events as ev

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class JobBuilder:
    job_id: str
    _tenant: str = "team-a"
    _gpus: int = 1
    _model: str | None = None
    _priority: int = 0
    _command: tuple[str, ...] = ("true",)
    _extra: dict = field(default_factory=dict)

    def tenant(self, tenant: str) -> JobBuilder:
        return replace(self, _tenant=tenant)

    def gpus(self, n: int) -> JobBuilder:
        return replace(self, _gpus=n)

    def model(self, model: str | None) -> JobBuilder:
        return replace(self, _model=model)

    def priority(self, p: int) -> JobBuilder:
        return replace(self, _priority=p)

    def command(self, *argv: str) -> JobBuilder:
        return replace(self, _command=argv)

    def gang(self, nodes: int) -> JobBuilder:
        return replace(self, _extra={**self._extra, "nodes": nodes})

    def share(self, milli: int, memory_mib: int = 0) -> JobBuilder:
        return replace(self, _extra={**self._extra, "gpu_share": {"milli": milli, "memory_mib": memory_mib}})

    def mig(self, profile: str) -> JobBuilder:
        return replace(self, _extra={**self._extra, "mig_profile": profile})

    def host(self, cpu_milli: int = 0, memory_mib: int = 0) -> JobBuilder:
        return replace(self, _extra={**self._extra, "cpu_milli": cpu_milli, "memory_mib": memory_mib})

    def image(self, image: str) -> JobBuilder:
        return replace(self, _extra={**self._extra, "image": image})

    def args(self, *argv: str) -> JobBuilder:
        return replace(self, _extra={**self._extra, "args": list(argv)})

    def selector(self, labels: dict[str, str]) -> JobBuilder:
        return replace(self, _extra={**self._extra, "node_selector": labels})

    def priority_class(self, name: str) -> JobBuilder:
        return replace(self, _extra={**self._extra, "priority_class": name})

    def name(self, name: str) -> JobBuilder:
        return replace(self, _extra={**self._extra, "name": name})

    def spec(self) -> ev.JobSpec:
        return ev.JobSpec(tenant=self._tenant, gpus=self._gpus, gpu_model=self._model, priority=self._priority,
                          command=list(self._command), **self._extra)


def a_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)
