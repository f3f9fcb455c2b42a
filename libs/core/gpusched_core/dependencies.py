"""Job dependencies (pure): whether a job that waits for others (``--after JOB[:ok|:any]``) may go in
line now, must wait (and for whom), or can never run. Quota judges it from the store's view of each
dependency when the job is admitted or released, and again whenever a dependency ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched_common import events as ev
from gpusched_common.ids import is_valid_id

from gpusched_core.lifecycle import TERMINAL, JobStatus

MAX_DEPENDENCIES = 64  # jobs one job may wait for


@dataclass(frozen=True)
class Known:
    """What the store says of a dependency: its tenant and status."""

    tenant: str | None
    status: JobStatus


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Waiting:
    on: tuple[str, ...]  # the dependencies not yet ended as asked
    reason: str


@dataclass(frozen=True)
class Never:
    reason: str


def judge(tenant: str, after: Sequence[ev.Dependency], known: Mapping[str, Known | None]) -> Ready | Waiting | Never:
    """``known``: each dependency's tenant and status (None: not in the store yet). A dependency of another
    tenant, or an ``ok`` one that ended other than Succeeded, means Never; the first such reason decides."""
    waiting: dict[str, list[str]] = {"ok": [], "any": []}
    for dep in after:
        seen = known.get(dep.job_id)
        if seen is not None and seen.tenant is not None and seen.tenant != tenant:
            return Never(f"dependency {dep.job_id} is not a job of tenant {tenant}")
        if seen is None or seen.status not in TERMINAL:
            waiting[dep.condition].append(dep.job_id)
        elif dep.condition == "ok" and seen.status is not JobStatus.SUCCEEDED:
            return Never(f"dependency {dep.job_id} ended {seen.status.value}, so this job, which waits for it to "
                         "succeed, can never run")
    if not waiting["ok"] and not waiting["any"]:
        return Ready()
    parts = [f"{', '.join(ids)} to {'succeed' if condition == 'ok' else 'end'}"
             for condition, ids in waiting.items() if ids]
    return Waiting(tuple(waiting["ok"] + waiting["any"]), "waiting for " + "; ".join(parts))


def check_after(job_id: str, after: Sequence[ev.Dependency]) -> list[str]:
    """Every reason a job's dependency list is refused (admission and the gateway check it)."""
    reasons = []
    if len(after) > MAX_DEPENDENCIES:
        reasons.append(f"a job waits for at most {MAX_DEPENDENCIES} others, got {len(after)}")
    ids = [dep.job_id for dep in after]
    bad = [i for i in ids if not is_valid_id(i)]
    if bad:
        reasons.append(f"dependency {bad[0]!r} is not a valid job id")
    if job_id in ids:
        reasons.append("a job cannot wait for itself")
    if len(set(ids)) != len(ids):
        reasons.append("a dependency is named twice")
    return reasons


def parse_after(text: str) -> ev.Dependency:
    """``JOB``, ``JOB:ok`` or ``JOB:any`` (CLI and pod annotation); ValueError with the reason."""
    job_id, _, condition = text.strip().rpartition(":") if text.strip().endswith((":ok", ":any")) else \
        (text.strip(), "", "ok")
    if not job_id:
        raise ValueError(f"--after {text!r}: name a job, as JOB, JOB:ok or JOB:any")
    return ev.Dependency(job_id=job_id, condition=condition)  # type: ignore[arg-type]
