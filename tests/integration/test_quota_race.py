"""Two quota processes racing for a tenant's last GPUs on real PostgreSQL: exactly one wins, and the
ledger never exceeds the cap."""

from __future__ import annotations

import asyncio

import asyncpg

from gpusched_common import decider
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from services.quota.handlers import queue_for_quota, reserve_for_tenant
from tests.builders import T0, a_job


async def admit(conn, job_id: str, gpus: int) -> None:
    spec = a_job(job_id).tenant("team-a").gpus(gpus).spec()
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, decider.decide(state, decider.RegisterSubmission(spec, T0), T0),
                            producer="test", now=T0)


async def test_two_quota_processes_racing_for_the_last_gpu_never_overshoot(database_url):
    setup = await connect(database_url)
    await setup.execute("INSERT INTO quota_ledger (tenant, cap_gpus, reserved_gpus) VALUES ('team-a', 8, 7)")
    for job_id in ("a", "b"):
        await admit(setup, job_id, 1)
    await setup.close()

    first, second = await connect(database_url), await connect(database_url)

    async def quota_process(conn, job_id: str) -> None:
        async with conn.transaction():
            await queue_for_quota(conn, job_id, (await load_job(conn, job_id)).spec)
            await reserve_for_tenant(conn, "team-a", 8, T0)
            await asyncio.sleep(0.2)  # hold the transaction open while the other one tries

    try:
        await asyncio.gather(quota_process(first, "a"), quota_process(second, "b"))
        check = first
        assert await check.fetchval("SELECT reserved_gpus FROM quota_ledger WHERE tenant = 'team-a'") == 8
        reserved = await check.fetch("SELECT stream_id FROM events WHERE type = 'QuotaReserved' ORDER BY 1")
        assert len(reserved) == 1
        waiting = await check.fetch("SELECT job_id, last_reason FROM quota_pending")
        assert len(waiting) == 1 and "at its quota of 8 GPUs" in waiting[0]["last_reason"]
    finally:
        await first.close()
        await second.close()


async def test_the_database_refuses_a_ledger_over_its_cap(database_url):
    conn = await connect(database_url)
    try:
        await conn.execute("INSERT INTO quota_ledger (tenant, cap_gpus, reserved_gpus) VALUES ('team-a', 8, 8)")
        try:
            await conn.execute("UPDATE quota_ledger SET reserved_gpus = 9 WHERE tenant = 'team-a'")
        except asyncpg.CheckViolationError:
            pass
        else:
            raise AssertionError("the ledger accepted 9 of 8 GPUs")
    finally:
        await conn.close()
