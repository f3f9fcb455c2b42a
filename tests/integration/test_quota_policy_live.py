"""The live quota service on the policy core, on real PostgreSQL: cohort borrowing, the core's waiting
reasons recorded once, releases, and two quota processes racing for a cohort's last GPU."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from gpusched_core import lifecycle
from gpusched_common.batching import Batch
from gpusched_common.db import connect
from gpusched_common.ids import job_stream
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming
from gpusched_common.store import load
from gpusched_core.quota import UNITS_PER_GPU, UsageHistory, load_tenancy
from services.quota.charges import release
from services.quota.handlers import make_job_event_handler, reserve_for_cohort
from services.quota.store import save_history
from gpusched_common.stores.tenancy import TenancyStore
from services.quota.store import install, lock_revisions
from tests.builders import T0, a_job

TENANTS_TEXT = """
version: 1
flavors: [A100-80GB]
priority_classes: {batch: 100}
default_priority_class: batch
fair_share: {half_life_s: 3600}
tenants:
  - name: acme
    priority_classes: [batch]
    children:
      - name: team-a
        quota: {A100-80GB: {nominal: 2, borrowing_limit: 2}}
      - name: team-b
        quota: {A100-80GB: {nominal: 4}}
"""
TENANTS = load_tenancy(TENANTS_TEXT)
AT_1H = T0 + timedelta(hours=1)


def handler(at=T0):
    return make_job_event_handler(TenancyStore(), lambda: at)


async def put_in_force(conn: asyncpg.Connection, text: str = TENANTS_TEXT) -> None:
    async with conn.transaction():
        await lock_revisions(conn)
        await install(conn, load_tenancy(text), text, source="test", event_id=None, now=T0)


async def submit(conn: asyncpg.Connection, job_id: str, tenant: str, gpus: int) -> None:
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model("A100-80GB").spec()
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0), T0),
                            producer="test", now=T0)


async def cancel(conn: asyncpg.Connection, job_id: str) -> None:
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, lifecycle.Cancel("test"), T0), producer="test", now=T0)


async def deliver(conn: asyncpg.Connection, job_id: str, event_type: str, at=T0) -> None:
    """Hand the job's latest ``event_type`` event to the quota handler as one batch, as batching does."""
    stored = [s for s in await load(conn, job_stream(job_id)) if s.envelope.type == event_type][-1]
    message = Incoming("gpusched.jobs.events", 0, 0, job_id, stored.envelope.model_dump_json().encode(), {})
    batch = Batch()
    await handler(at)(conn, message, batch)
    await batch.finish(conn)


async def submit_and_deliver(conn: asyncpg.Connection, job_id: str, tenant: str, gpus: int) -> None:
    async with conn.transaction():
        await submit(conn, job_id, tenant, gpus)
    async with conn.transaction():
        await deliver(conn, job_id, "JobAdmitted")


async def events_of(conn: asyncpg.Connection, job_id: str, event_type: str) -> list[dict]:
    return [s.envelope.payload for s in await load(conn, job_stream(job_id)) if s.envelope.type == event_type]


async def reserved_gpus(conn: asyncpg.Connection, tenant: str) -> float:
    units = await conn.fetchval("SELECT reserved_units FROM quota_policy_usage WHERE tenant = $1", tenant)
    return units / UNITS_PER_GPU


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    await put_in_force(connection)
    yield connection
    await connection.close()


async def test_a_tenant_borrows_idle_cohort_quota_up_to_its_borrowing_limit(conn):
    for job_id, gpus in (("a1", 2), ("a2", 2), ("a3", 1)):
        await submit_and_deliver(conn, job_id, "team-a", gpus)

    assert [e["tenant_reserved_gpus"] for j in ("a1", "a2") for e in await events_of(conn, j, "QuotaReserved")] \
        == [2, 4]
    assert await reserved_gpus(conn, "team-a") == 4  # 2 nominal + 2 borrowed from idle team-b
    [deferred] = await events_of(conn, "a3", "QuotaDeferred")
    assert deferred["reason"] == "tenant team-a at its limit (4/2 A100-80GB + borrowing 2); job needs 1"
    assert await conn.fetchval("SELECT as_of_s FROM quota_policy_history WHERE tenant = 'team-a'") \
        == T0.timestamp()


async def test_a_tenant_at_quota_waits_with_the_cores_reason_recorded_once_until_a_release(conn):
    await submit_and_deliver(conn, "b1", "team-b", 4)
    await submit_and_deliver(conn, "a1", "team-a", 2)
    await submit_and_deliver(conn, "a2", "team-a", 1)
    async with conn.transaction():
        await reserve_for_cohort(conn, TENANTS, "acme", T0)  # another cycle: the same reason again

    [deferred] = await events_of(conn, "a2", "QuotaDeferred")
    assert deferred["reason"] == "tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend"

    async with conn.transaction():
        await cancel(conn, "b1")
    async with conn.transaction():
        await deliver(conn, "b1", "JobCancelled", at=AT_1H)

    [released] = await events_of(conn, "b1", "QuotaReleased")
    assert released["tenant_reserved_gpus"] == 0
    assert len(await events_of(conn, "a2", "QuotaReserved")) == 1  # borrows what team-b gave back
    assert await reserved_gpus(conn, "team-a") == 3
    assert await reserved_gpus(conn, "team-b") == 0
    history = await conn.fetchrow("SELECT as_of_s, geq_s FROM quota_policy_history WHERE tenant = 'team-b'")
    assert history["as_of_s"] == AT_1H.timestamp()
    assert 0 < history["geq_s"]["A100-80GB"] < 4 * 3600  # 4 GPUs held for an hour, decayed


async def test_two_quota_processes_racing_for_the_cohorts_last_gpu_never_overshoot(conn, database_url):
    await submit_and_deliver(conn, "b1", "team-b", 3)
    await submit_and_deliver(conn, "a1", "team-a", 2)  # the cohort's 6 GPUs: 5 reserved, 1 left
    async with conn.transaction():
        await submit(conn, "a2", "team-a", 1)
        await submit(conn, "b2", "team-b", 1)
    first, second = await connect(database_url), await connect(database_url)

    async def quota_process(c: asyncpg.Connection, job_id: str) -> None:
        async with c.transaction():
            await deliver(c, job_id, "JobAdmitted")
            await asyncio.sleep(0.2)  # hold the cohort's rows while the other process tries

    try:
        await asyncio.gather(quota_process(first, "a2"), quota_process(second, "b2"))
    finally:
        await first.close()
        await second.close()
    winners = [j for j in ("a2", "b2") if await events_of(conn, j, "QuotaReserved")]
    assert len(winners) == 1
    [loser] = {"a2", "b2"} - set(winners)
    assert len(await events_of(conn, loser, "QuotaDeferred")) == 1
    assert await conn.fetchval("SELECT sum(reserved_units) FROM quota_policy_usage") == 6 * UNITS_PER_GPU


async def test_two_releases_of_one_ended_job_racing_give_its_quota_back_once(conn, database_url):
    """The quota handler (the job's end) and the store's recovery pass (the same end, seen in the store) both
    release one job: the second, which read the job before the first committed, gives back nothing more; it
    must not take the units of the tenant's other job, which still runs (that would lend them out twice)."""
    await submit_and_deliver(conn, "b1", "team-b", 2)
    await submit_and_deliver(conn, "b2", "team-b", 2)
    async with conn.transaction():
        await cancel(conn, "b1")
    first, second = await connect(database_url), await connect(database_url)
    released = asyncio.Event()

    async def quota_handler() -> None:
        async with first.transaction():
            await deliver(first, "b1", "JobCancelled")
            released.set()
            await asyncio.sleep(0.3)  # the cohort's rows held while the other release reads and waits

    async def recovery_pass() -> None:
        await released.wait()
        async with second.transaction():
            await release(second, TENANTS, "b1", T0)

    try:
        await asyncio.gather(quota_handler(), recovery_pass())
    finally:
        await first.close()
        await second.close()
    assert len(await events_of(conn, "b1", "QuotaReleased")) == 1
    assert await reserved_gpus(conn, "team-b") == 2  # b2's, still held


async def test_the_database_refuses_usage_above_nominal_plus_borrowing(conn):
    await submit_and_deliver(conn, "a1", "team-a", 4)
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("UPDATE quota_policy_usage SET reserved_units = reserved_units + 1 WHERE tenant = 'team-a'")


async def test_a_preempted_job_gives_its_quota_back_and_queues_again(conn):
    await submit_and_deliver(conn, "a1", "team-a", 4)
    async with conn.transaction():
        for command in (lifecycle.Place("n1", (0, 1, 2, 3), ("u0", "u1", "u2", "u3"), "A100-80GB", "firstfit", "fits"),
                        lifecycle.RequestPreemption("x", 1000, "team-b", "reclaim", 30.0, T0),
                        lifecycle.RecordExit("n1", 0, 10.0)):
            state = await load_job(conn, "a1")
            await append_job_events(conn, state, lifecycle.decide(state, command, T0), producer="test", now=T0)
    async with conn.transaction():
        await deliver(conn, "a1", "JobPreempted", at=AT_1H)

    assert len(await events_of(conn, "a1", "QuotaReleased")) == 1
    assert len(await events_of(conn, "a1", "QuotaReserved")) == 2  # queued again, and the quota is free
    assert await reserved_gpus(conn, "team-a") == 4


async def test_gangs_shares_and_mig_slices_are_charged_what_they_hold(conn):
    from gpusched_common import events as ev

    shapes = {"gang": dict(gpus=2, nodes=2), "share": dict(gpus=1, gpu_share=ev.GpuShareSpec(milli=250)),
              "mig": dict(gpus=1, mig_profile="3g.40gb")}
    for job_id, shape in shapes.items():
        spec = ev.JobSpec(tenant="team-b", gpu_model="A100-80GB", command=["true"], **shape)
        async with conn.transaction():
            state = await load_job(conn, job_id)
            await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0), T0),
                                    producer="test", now=T0)
        async with conn.transaction():
            await deliver(conn, job_id, "JobAdmitted")

    held = {r["job_id"]: r["units"] for r in await conn.fetch("SELECT job_id, units FROM quota_policy_reservations")}
    assert held == {"gang": 4 * UNITS_PER_GPU, "share": UNITS_PER_GPU // 4, "mig": 3 * UNITS_PER_GPU // 7}
    assert await reserved_gpus(conn, "team-b") == 4 + 0.25 + 3 / 7
    [gang] = await events_of(conn, "gang", "QuotaReserved")
    assert (gang["gpu_model"], gang["tenant_reserved_gpus"]) == ("A100-80GB", 4)


async def test_a_tenant_removed_by_a_new_revision_keeps_what_it_holds_until_it_ends_and_gets_no_more(conn):
    await submit_and_deliver(conn, "b1", "team-b", 2)
    without_team_b = TENANTS_TEXT.replace("version: 1", "version: 1\nrevision: 2").split("      - name: team-b")[0]
    await put_in_force(conn, without_team_b)
    await submit_and_deliver(conn, "b2", "team-b", 1)
    [deferred] = await events_of(conn, "b2", "QuotaDeferred")
    assert deferred["reason"] == "tenant team-b is not in the tenancy file"
    async with conn.transaction():
        await cancel(conn, "b1")
    async with conn.transaction():
        await deliver(conn, "b1", "JobCancelled")
    assert len(await events_of(conn, "b1", "QuotaReleased")) == 1
    assert await reserved_gpus(conn, "team-b") == 0


async def test_the_queue_a_reader_sees_is_the_cycles_fair_share_order_with_each_reason(conn):
    from gpusched_cli.queries import get_job, queue

    for job_id, tenant, gpus in (("b1", "team-b", 4), ("a1", "team-a", 2), ("a2", "team-a", 1), ("b2", "team-b", 1)):
        await submit_and_deliver(conn, job_id, tenant, gpus)
    # team-a ran far more than its share in the last hours: within a class its jobs rank behind team-b's,
    # though both waiting jobs were submitted at T0 and "a2" sorts before "b2"
    await save_history(conn, "team-a", UsageHistory(T0.timestamp(), {"A100-80GB": 5e7}))

    waiting = [w for w in await queue(conn, now=T0) if w["waiting_for"] == "quota"]
    assert [(w["job_id"], w["queue"], w["position"]) for w in waiting] == [("b2", "quota/acme", 1),
                                                                           ("a2", "quota/acme", 2)]
    assert waiting[1]["reason"] == "tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend"
    assert [w["job_id"] for w in await queue(conn, tenant="team-a", now=T0) if w["waiting_for"] == "quota"] == ["a2"]
    job = await get_job(conn, "a2", now=T0)
    assert job["waiting"]["describe"] == ("#2 in quota/acme: tenant team-a at quota (2/2 A100-80GB) and cohort "
                                          "has nothing to lend")
    assert await get_job(conn, "nobody") is None


async def test_history_written_twice_encoded_before_migration_013_reads_back_as_the_object(tmp_path, pg_server):
    import uuid

    from gpusched_common.db import MIGRATIONS_DIR, drop_database, ensure_database, migrate
    from gpusched_common.stores.quota import load_history

    url = f"{pg_server}/gpusched_test_{uuid.uuid4().hex[:10]}"
    await ensure_database(url)
    try:
        for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
            if path.name < "013":
                (tmp_path / path.name).write_text(path.read_text())
        await migrate(url, tmp_path)
        old = await connect(url)
        try:  # what save_history wrote before: the object as a JSON string inside jsonb
            await old.execute("INSERT INTO quota_policy_history (tenant, as_of_s, geq_s) VALUES ('t', 1.5, $1)",
                              '{"A100-80GB": 7.25}')
            assert await old.fetchval("SELECT jsonb_typeof(geq_s) FROM quota_policy_history") == "string"
        finally:
            await old.close()
        assert await migrate(url) == [p.name for p in sorted(MIGRATIONS_DIR.glob("*.sql")) if p.name >= "013"]
        conn = await connect(url)
        try:
            assert dict((await load_history(conn, ("t",)))["t"].geq_s) == {"A100-80GB": 7.25}
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.execute("UPDATE quota_policy_history SET geq_s = to_jsonb('{}'::text)")
        finally:
            await conn.close()
    finally:
        await drop_database(url)



async def forge(conn: asyncpg.Connection, job_id: str, payload, at=T0) -> None:
    """Hand quota a job event no service appended (as a plain Kafka client could publish it)."""
    import uuid

    from gpusched_common import events as ev

    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=job_stream(job_id), occurred_at=at,
                                producer="placement")
    message = Incoming("gpusched.jobs.events", 0, 0, job_id, envelope.model_dump_json().encode(), {})
    batch = Batch()
    async with conn.transaction():
        await handler(at)(conn, message, batch)
        await batch.finish(conn)


async def test_forged_job_events_change_no_queue_charge_or_refund(conn):
    from gpusched_common import events as ev
    from gpusched_common.jobs import NOT_IN_STORE

    await submit_and_deliver(conn, "b1", "team-b", 4)  # reserved: Queued, charged 4
    before = NOT_IN_STORE.total()
    for forged in (ev.JobSucceeded(job_id="b1", node_id="n1", runtime_s=1.0), ev.JobCancelled(job_id="b1", reason="forged"),
                   ev.JobHeld(job_id="b1", reason="forged"), ev.JobPreempted(job_id="b1", node_id="n1", exit_code=143, lost_s=0.0)):
        await forge(conn, "b1", forged)  # each would give back 4 GPUs of a job that still holds them
    assert await reserved_gpus(conn, "team-b") == 4 and (await load_job(conn, "b1")).quota_held
    assert NOT_IN_STORE.total() == before + 4
    spec = a_job("ghost").tenant("team-a").gpus(2).spec()  # a job nobody submitted, pushed into the queue
    await forge(conn, "ghost", ev.JobAdmitted(job_id="ghost", spec=spec, submitted_at=T0))
    assert await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE job_id = 'ghost'") == 0
    assert not await conn.fetchval("SELECT count(*) FROM events WHERE stream_id = 'job-ghost'")
