"""Quota's side of job dependencies (``--after JOB[:ok|:any]``): an admitted (or released) job that waits
for others goes in line only once they have ended as it asks (``gpusched_core.dependencies.judge``, from
the store's view of each); meanwhile it stays Admitted with the reason (``waiting for j-... to succeed``)
and a row per dependency in ``quota_job_dependencies``. When a job ends, its dependants are judged again:
in line, still waiting, or, when one can never run (an ``ok`` dependency failed), Cancelled with the
reason. A lock per dependency (``store.lock_dependencies``) makes the judge and the end take turns."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core.dependencies import Known, Never, Ready, Waiting, judge
from gpusched_core.lifecycle import JobState, JobStatus

from services.quota import store

SERVICE = "quota"


async def ready_to_queue(conn: asyncpg.Connection, state: JobState, now: datetime) -> bool:
    """Whether ``state``'s job (Admitted, with a spec) may go in quota's line now. When it may not, what
    it waits for is recorded with the reason, or, when it can never run, it ends Cancelled."""
    assert state.spec is not None
    after = state.spec.after
    if not after:
        return True
    ids = sorted({dep.job_id for dep in after})
    await store.lock_dependencies(conn, ids)
    known: dict[str, Known | None] = {}
    for job_id in ids:
        dep = await load_job(conn, job_id)
        known[job_id] = None if dep.status is None else Known(dep.spec.tenant if dep.spec else None, dep.status)
    verdict = judge(state.spec.tenant, after, known)
    if isinstance(verdict, Ready):
        await store.forget_waits(conn, state.job_id)
        return True
    if isinstance(verdict, Waiting):
        await store.record_waits(conn, state.job_id, verdict.on)
        command: lifecycle.Command = lifecycle.DeferQuota(verdict.reason)
    else:
        assert isinstance(verdict, Never)
        await store.forget_waits(conn, state.job_id)
        command = lifecycle.Cancel(verdict.reason, requested_by=SERVICE)
    await append_job_events(conn, state, lifecycle.decide(state, command, now), producer=SERVICE, now=now)
    return False


async def ready_dependants(conn: asyncpg.Connection, ended: list[str], now: datetime) -> list[JobState]:
    """After the ``ended`` jobs ended: judge each job waiting for any of them again; those now ready to go
    in line."""
    if not ended:
        return []
    await store.lock_dependencies(conn, ended)
    ready = []
    for dependant in await store.dependants(conn, ended):
        state = await load_job(conn, dependant)
        if state.status is not JobStatus.ADMITTED or state.spec is None:
            await store.forget_waits(conn, dependant)  # held or ended meanwhile: judged again on release
            continue
        if await ready_to_queue(conn, state, now):
            ready.append(state)
    return ready
