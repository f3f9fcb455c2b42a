"""The live reclaim path on the real broker and PostgreSQL: quota's ReclaimRequested on
gpusched.quota.reclaims makes the preemption service stop the fewest borrower jobs of the flavor, and
neither a redelivery nor a repeated request preempts anything more. A gang victim, of a reclaim or of a
priority preemption, is told to stop on every node it runs on."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import build_broker, publish
from gpusched_common.runtime import running
from gpusched_common.stores.cluster import ClusterCache
from gpusched_common.topics import NODES_COMMANDS, QUOTA_RECLAIMS
from gpusched_core import placement as engine
from services.placement.handlers import process
from services.preemption.app import setup
from services.preemption.settings import PreemptionSettings
from services.preemption.handlers import SERVICE, consider, consider_all
from services.preemption.handlers import reclaim
from tests.builders import a_job
from tests.integration.kafka_helpers import read_topic

GPU = 7000  # quota units per GPU
NOW = datetime.now(timezone.utc)
STARTED = NOW - timedelta(hours=1)  # past the minimum run time that protects a fresh run
POLICY = engine.make_policy("bestfit")


def node(node_id: str, model: str, gpus: int = 8) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        node_id=node_id, hostname=node_id, cpu_milli=64_000, memory_mib=512_000, nvml_backend="simulated",
        lease_epoch=1, gpus=[ev.GpuInventory(index=i, uuid=f"{node_id}-{i}", model=model, memory_mib=81920)
                             for i in range(gpus)])


async def submit(conn: asyncpg.Connection, job_id: str, tenant: str, gpus: int, model: str,
                 nodes: int = 1) -> lifecycle.JobState:
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model(model).gang(nodes).spec()
    state = await load_job(conn, job_id)
    return await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, STARTED),
                                                                STARTED), producer="test", now=STARTED)


async def run(conn: asyncpg.Connection, job_id: str, tenant: str, model: str,
              members: list[tuple[str, tuple[int, ...]]]) -> None:
    """A job running since an hour ago on ``members`` (one node, or each node of a gang), charged to
    the quota policy's ledger as the live quota service would."""
    gpus = len(members[0][1])
    state = await submit(conn, job_id, tenant, gpus, model, nodes=len(members))
    state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.ReserveQuota(gpus, 64, model),
                                                                STARTED), producer="test", now=STARTED)
    placed = ev.JobPlaced(job_id=job_id, node_id=members[0][0], gpu_indices=list(members[0][1]),
                          gpu_uuids=[f"{members[0][0]}-{i}" for i in members[0][1]], gpu_model=model,
                          policy="test", reason="test",
                          members=[ev.GangMember(rank=r, node_id=n, gpu_indices=list(g),
                                                 gpu_uuids=[f"{n}-{i}" for i in g])
                                   for r, (n, g) in enumerate(members)] if len(members) > 1 else [])
    state = await append_job_events(conn, state, (placed,), producer="test", now=STARTED)
    await conn.executemany("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at)"
                           " VALUES ($1, $2, $3, $4)", [(n, i, job_id, STARTED) for n, g in members for i in g])
    state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RecordStart(members[0][0], 1, STARTED),
                                                                STARTED), producer="test", now=STARTED)
    await conn.execute("INSERT INTO quota_policy_reservations (job_id, tenant, flavor, units) VALUES ($1, $2, $3, $4)",
                       job_id, tenant, model, gpus * len(members) * GPU)


def reclaim_request(gpus: float, borrowers: list[tuple[str, float]], at: datetime,
                    flavor: str = "A100-80GB") -> ev.ReclaimRequested:
    return ev.ReclaimRequested(
        tenant="team-a", cohort="acme", flavor=flavor, gpus=gpus, for_jobs=["a1"],
        borrowers=[ev.ReclaimBorrower(tenant=t, borrowed_gpus=g) for t, g in borrowers],
        reason="team-a is under its nominal A100-80GB quota", requested_at=at)


async def send(settings, request: ev.ReclaimRequested, event_id: str, recorded: bool = True) -> None:
    """Publish a reclaim request as quota does: recorded first (``recorded=False``: a forgery, on the bus only)."""
    if recorded:
        from services.quota.store import record_reclaim

        conn = await connect(settings.database_url)
        try:
            if not await conn.fetchval("SELECT 1 FROM quota_reclaims WHERE event_id = $1::uuid", event_id):
                await record_reclaim(conn, event_id, request, round(request.gpus * GPU))
        finally:
            await conn.close()
    broker = build_broker(settings, "test-quota")
    await broker.connect()
    try:
        envelope = ev.make_envelope(request, event_id=event_id, stream_id=f"tenant-{request.tenant}",
                                    occurred_at=request.requested_at, producer="quota", tenant=request.tenant)
        await publish(broker, QUOTA_RECLAIMS.name, request.tenant, envelope.model_dump_json().encode(),
                      {"event-type": request.TYPE})
    finally:
        await broker.stop()


async def until(check, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def preemptions(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT stream_id, payload FROM events WHERE type = 'PreemptionRequested'"
                            " ORDER BY global_position")


async def cluster(conn: asyncpg.Connection) -> None:
    """n1 and n3: A100s, n2: H100s. team-b borrows A100s (b4, b2) and runs H100s (bh); team-c runs c2
    within its quota; team-a's job a1 (4 A100) waits for the quota team-b borrowed."""
    async with conn.transaction():
        for registered in (node("n1", "A100-80GB"), node("n2", "H100-80GB"), node("n3", "A100-80GB", gpus=4)):
            await process(conn, registered, NOW, POLICY)
        await run(conn, "b4", "team-b", "A100-80GB", [("n1", (0, 1, 2, 3))])
        await run(conn, "b2", "team-b", "A100-80GB", [("n1", (4, 5))])
        await run(conn, "c2", "team-c", "A100-80GB", [("n1", (6, 7))])
        await run(conn, "c4", "team-c", "A100-80GB", [("n3", (0, 1, 2, 3))])
        await run(conn, "bh", "team-b", "H100-80GB", [("n2", tuple(range(8)))])
        await submit(conn, "a1", "team-a", 4, "A100-80GB")  # Admitted: quota holds it back


async def test_a_reclaim_request_preempts_the_fewest_borrower_jobs_of_the_flavor_and_a_repeat_nothing_more(
        settings):
    conn = await connect(settings.database_url)
    try:
        await cluster(conn)
        first = reclaim_request(4, [("team-b", 6)], NOW)
        first_id = str(uuid.uuid4())
        async with running(SERVICE, settings, setup):
            await send(settings, first, first_id)
            await until(lambda: preemptions(conn))
            [requested] = await preemptions(conn)
            assert requested["stream_id"] == "job-b4"  # 4 GPUs of one borrower job, not b2, c2, c4 or bh
            payload = requested["payload"]
            assert payload["preemptor_job_id"] == "a1" and payload["preemptor_tenant"] == "team-a"
            found = re.fullmatch(r"preempted to return borrowed A100-80GB capacity to tenant team-a \(under its nominal"
                                 r" quota\) for its job a1: tenant team-b borrowed it; lost (\d+) min since it started"
                                 r" \(no checkpoint\)", payload["reason"])
            assert found, payload["reason"]
            # the service judges the loss on its own clock: the run started an hour before this module was
            # loaded, however long ago that is
            ran_min = (datetime.now(timezone.utc) - STARTED).total_seconds() / 60
            assert ran_min - 2 <= int(found.group(1)) <= ran_min + 1, (found.group(1), ran_min)
            commands = [json.loads(r.value) for r in await read_topic(settings.kafka_bootstrap, NODES_COMMANDS.name,
                                                                        expect=1)]
            assert [(c["payload"]["job_id"], c["payload"]["node_id"]) for c in commands
                    if c["type"] == "PreemptJob"] == [("b4", "n1")]

            # the same message again, then quota repeating the request while b4 stops
            repeat_id = str(uuid.uuid4())
            await send(settings, first, first_id)
            await send(settings, reclaim_request(4, [("team-b", 6)], NOW + timedelta(seconds=2)), repeat_id)
            await until(lambda: conn.fetchval("SELECT 1 FROM inbox WHERE consumer = $1 AND event_id = $2",
                                              SERVICE, repeat_id))
        assert len(await preemptions(conn)) == 1
        evaluation = await conn.fetchrow("SELECT outcome, reasons FROM preemption_evaluations WHERE job_id = 'a1'")
        assert evaluation["outcome"] == "await"
        assert evaluation["reasons"][1].startswith("nothing more to reclaim: jobs already stopping for a1")
        held = await conn.fetch("SELECT node_id, gpu_index FROM gpu_nominations WHERE job_id = 'a1' ORDER BY 2")
        assert [(r["node_id"], r["gpu_index"]) for r in held] == [("n1", i) for i in range(4)]  # b4's GPUs, for a1
        assert await conn.fetchval("SELECT count(*) FROM reclaim_victims WHERE for_job_id = 'a1'") == 1
    finally:
        await conn.close()


async def test_a_gang_victim_is_told_to_stop_on_every_node_it_runs_on(settings):
    conn = await connect(settings.database_url)
    try:
        async with conn.transaction():
            for registered in (node("n1", "A100-80GB", gpus=4), node("n2", "A100-80GB", gpus=4)):
                await process(conn, registered, NOW, POLICY)
            await run(conn, "gang", "team-b", "A100-80GB", [("n1", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3))])
            await submit(conn, "a1", "team-a", 4, "A100-80GB")
        async with conn.transaction():
            plan = await reclaim(conn, reclaim_request(4, [("team-b", 8)], NOW),
                                 PreemptionSettings.of(settings).policy(), NOW)
        assert plan is not None and plan.victim_ids == ("gang",)
        commands = await conn.fetch("SELECT value FROM outbox WHERE topic = $1 AND producer = $2 ORDER BY id",
                                    NODES_COMMANDS.name, SERVICE)
        preempts = [m["payload"] for m in map(json.loads, (bytes(r["value"]) for r in commands))
                    if m["type"] == "PreemptJob"]
        assert sorted((p["job_id"], p["node_id"]) for p in preempts) == [("gang", "n1"), ("gang", "n2")]
    finally:
        await conn.close()


async def test_nothing_to_reclaim_is_recorded_when_borrowers_hold_no_job_of_the_flavor(settings):
    conn = await connect(settings.database_url)
    try:
        await cluster(conn)
        async with conn.transaction():
            plan = await reclaim(conn, reclaim_request(4, [("team-x", 4)], NOW), PreemptionSettings.of(settings).policy(), NOW)
        assert plan is not None and plan.outcome == "none"
        assert plan.reasons[1].startswith("nothing to reclaim: borrowers (team-x) hold no preemptible job of A100-80GB")
        assert not await preemptions(conn)
        assert await conn.fetchval("SELECT outcome FROM preemption_evaluations WHERE job_id = 'a1'") == "none"
    finally:
        await conn.close()


async def test_a_request_made_before_earlier_victims_gave_their_quota_back_preempts_nothing(settings):
    conn = await connect(settings.database_url)
    try:
        await cluster(conn)
        async with conn.transaction():
            await reclaim(conn, reclaim_request(4, [("team-b", 6)], NOW), PreemptionSettings.of(settings).policy(), NOW)
        later = NOW + timedelta(seconds=40)
        async with conn.transaction():  # b4 stops, placement frees its GPUs and quota takes its quota back
            for command in (lifecycle.RecordExit("n1", 143, 3600.0), lifecycle.ReleaseQuota(0)):
                state = await load_job(conn, "b4")
                await append_job_events(conn, state, lifecycle.decide(state, command, later), producer="test",
                                        now=later)
            await conn.execute("DELETE FROM gpu_allocations WHERE job_id = 'b4'")
            await conn.execute("DELETE FROM quota_policy_reservations WHERE job_id = 'b4'")
        async with conn.transaction():  # a request quota made before it saw b4's quota back
            plan = await reclaim(conn, reclaim_request(4, [("team-b", 6)], NOW + timedelta(seconds=20)),
                                 PreemptionSettings.of(settings).policy(), later)
        assert plan is not None and plan.outcome == "await" and not plan.victims
        assert [r["stream_id"] for r in await preemptions(conn)] == ["job-b4"]
    finally:
        await conn.close()


async def test_a_gang_victim_of_a_priority_preemption_is_told_to_stop_on_every_node_too(settings):
    conn = await connect(settings.database_url)
    try:
        async with conn.transaction():
            for registered in (node("n1", "A100-80GB", gpus=4), node("n2", "A100-80GB", gpus=4)):
                await process(conn, registered, NOW, POLICY)
            await run(conn, "gang", "team-b", "A100-80GB", [("n1", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3))])
            spec = a_job("h").tenant("team-b").gpus(4).model("A100-80GB").priority(100).spec()
            state = await load_job(conn, "h")
            for command in (lifecycle.RegisterSubmission(spec, NOW), lifecycle.ReserveQuota(4, 64, "A100-80GB")):
                state = await append_job_events(conn, state, lifecycle.decide(state, command, NOW), producer="test",
                                                now=NOW)
        async with conn.transaction():
            await consider(conn, "h", PreemptionSettings.of(settings).policy(), NOW)
        commands = await conn.fetch("SELECT value FROM outbox WHERE topic = $1 AND producer = $2 ORDER BY id",
                                    NODES_COMMANDS.name, SERVICE)
        preempts = [m["payload"] for m in map(json.loads, (bytes(r["value"]) for r in commands))
                    if m["type"] == "PreemptJob"]
        assert sorted((p["job_id"], p["node_id"]) for p in preempts) == [("gang", "n1"), ("gang", "n2")]
        [selected] = await conn.fetch("SELECT payload FROM events WHERE type = 'VictimsSelected'")
        assert selected["payload"]["victims"] == ["gang"] and selected["payload"]["node_ids"] == ["n1", "n2"]
    finally:
        await conn.close()


async def test_a_batch_of_deferred_jobs_is_weighed_on_one_read_of_the_cluster(settings):
    """``consider_all``: jobs read together, the cluster read once while nobody changes it (the cache) and
    again after a preemption; each job's evaluation recorded, the first preempts, the second (same shape,
    nothing of lower priority left) waits, and a third that is placed already is left alone."""
    conn = await connect(settings.database_url)
    cache = ClusterCache()
    try:
        async with conn.transaction():
            await process(conn, node("n1", "A100-80GB", gpus=4), NOW, POLICY)
            await run(conn, "low", "team-b", "A100-80GB", [("n1", (0, 1, 2, 3))])
            for job_id in ("h1", "h2", "gone"):
                spec = a_job(job_id).tenant("team-b").gpus(4).model("A100-80GB").priority(100).spec()
                state = await load_job(conn, job_id)
                for command in (lifecycle.RegisterSubmission(spec, NOW), lifecycle.ReserveQuota(4, 64, "A100-80GB")):
                    state = await append_job_events(conn, state, lifecycle.decide(state, command, NOW),
                                                    producer="test", now=NOW)
            state = await load_job(conn, "gone")
            await append_job_events(conn, state, lifecycle.decide(state, lifecycle.Cancel("changed my mind"), NOW),
                                    producer="test", now=NOW)
        policy = PreemptionSettings.of(settings).policy()
        async with conn.transaction():
            await consider_all(conn, ["gone", "h1", "h2"], policy, NOW, cache=cache)
        assert cache.loads == 2  # once for h1, again for h2 after h1's preemption changed the cluster
        rows = {r["job_id"]: r for r in await conn.fetch("SELECT * FROM preemption_evaluations")}
        assert sorted(rows) == ["h1", "h2"] and rows["h1"]["outcome"] == "preempt"
        assert rows["h2"]["outcome"] in ("await", "none") and rows["h2"]["reasons"]
        async with conn.transaction():  # nothing changed since: the cluster is not read again
            await consider_all(conn, ["h2"], policy, NOW, cache=cache)
        assert (cache.loads, cache.hits) == (2, 1)
    finally:
        await conn.close()


async def test_a_job_nobody_runs_below_is_weighed_without_the_cycle_lock(settings):
    """With no running job of lower priority and none being preempted, ``consider_all`` records "none" while
    placement holds the cycle lock (it neither waits for it nor reads the cluster); once a job of lower priority
    runs, it needs the lock (here held elsewhere: its wait times out)."""
    from gpusched_common.stores.cluster import lock_cycle

    async def queued(job_id: str, priority: int) -> None:
        spec = a_job(job_id).tenant("team-b").gpus(4).model("A100-80GB").priority(priority).spec()
        state = await load_job(conn, job_id)
        for command in (lifecycle.RegisterSubmission(spec, NOW), lifecycle.ReserveQuota(4, 64, "A100-80GB")):
            state = await append_job_events(conn, state, lifecycle.decide(state, command, NOW), producer="test", now=NOW)

    conn = await connect(settings.database_url)
    holder = await connect(settings.database_url)
    cache = ClusterCache()
    policy = PreemptionSettings.of(settings).policy()
    try:
        async with conn.transaction():
            await process(conn, node("n1", "A100-80GB", gpus=4), NOW, POLICY)
            await run(conn, "same", "team-b", "A100-80GB", [("n1", (0, 1, 2, 3))])  # priority 0, as "w" below
            await queued("w", 0)
        async with holder.transaction():
            await lock_cycle(holder)  # placement in the middle of a cycle
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = 2000")
                await consider_all(conn, ["w"], policy, NOW, cache=cache)
            row = await conn.fetchrow("SELECT outcome, reasons FROM preemption_evaluations WHERE job_id = 'w'")
            assert row["outcome"] == "none" and cache.loads == 0
            assert row["reasons"][1] == "no running job may be preempted for it"
            async with conn.transaction():
                await queued("h", 100)  # "same" runs below it: only the cluster can tell
            with pytest.raises(asyncpg.LockNotAvailableError):
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = 300")
                    await consider_all(conn, ["h"], policy, NOW, cache=cache)
        async with conn.transaction():  # placement's cycle is over: it preempts
            await consider_all(conn, ["h"], policy, NOW, cache=cache)
        assert await conn.fetchval("SELECT outcome FROM preemption_evaluations WHERE job_id = 'h'") == "preempt"
    finally:
        await holder.close()
        await conn.close()


GUEST_TENANCY = """
version: 1
flavors: [A100-80GB]
priority_classes: {{batch: 0}}
default_priority_class: batch
fair_share: {{half_life_s: 3600}}
guest_tenant: {guest}
tenants:
  - name: acme
    children:
      - name: team-a
        quota: {{A100-80GB: {{nominal: 4}}}}
      - name: team-b
        quota: {{A100-80GB: {{nominal: 0}}}}
"""


@pytest.mark.parametrize("guest", ["team-a", "team-b"])
async def test_guests_are_reclaimed_for_and_from_as_the_tenant_they_are_charged_to(settings, guest):
    """guest team-a: the waiting job is a guest's (charged to team-a, the tenant quota reclaims for);
    guest team-b: the borrower's running job is a guest's (charged to team-b, the borrower quota names)."""
    from gpusched_core.quota import load_tenancy
    from services.quota.store import install, lock_revisions

    text = GUEST_TENANCY.format(guest=guest)
    waiting, running = ("v1", "b4") if guest == "team-a" else ("a1", "o4")
    conn = await connect(settings.database_url)
    try:
        async with conn.transaction():
            await lock_revisions(conn)
            await install(conn, load_tenancy(text), text, source="test", event_id=None, now=NOW)
            await process(conn, node("n1", "A100-80GB", gpus=4), NOW, POLICY)
            await run(conn, running, "outsider" if guest == "team-b" else "team-b", "A100-80GB", [("n1", (0, 1, 2, 3))])
            await conn.execute("UPDATE quota_policy_reservations SET tenant = 'team-b' WHERE job_id = $1", running)
            await submit(conn, waiting, "visitor" if guest == "team-a" else "team-a", 4, "A100-80GB")
        request = reclaim_request(4, [("team-b", 4)], NOW).model_copy(update={"for_jobs": [waiting]})
        async with conn.transaction():
            plan = await reclaim(conn, request, PreemptionSettings.of(settings).policy(), NOW)
        assert plan is not None and plan.victim_ids == (running,), plan and plan.reasons
        assert [r["stream_id"] for r in await preemptions(conn)] == [f"job-{running}"]
    finally:
        await conn.close()


async def test_a_forged_reclaim_request_preempts_nobody(settings):
    """A ReclaimRequested quota never sent (not in ``quota_reclaims``) naming borrowers is ignored; the
    recorded request sent after it is answered, so the forgery had its chance to act first."""
    conn = await connect(settings.database_url)
    try:
        await cluster(conn)
        forged = reclaim_request(8, [("team-b", 8), ("team-c", 6)], NOW)
        async with running(SERVICE, settings, setup):
            await send(settings, forged, str(uuid.uuid4()), recorded=False)
            real_id = str(uuid.uuid4())
            await send(settings, reclaim_request(4, [("team-b", 6)], NOW), real_id)
            await until(lambda: conn.fetchval("SELECT 1 FROM inbox WHERE consumer = $1 AND event_id = $2",
                                              SERVICE, real_id))
            await until(lambda: preemptions(conn))
        assert [r["stream_id"] for r in await preemptions(conn)] == ["job-b4"]  # the real request's one victim
    finally:
        await conn.close()


async def test_a_mig_instance_held_for_a_preemptor_is_kept_as_the_instance_and_the_cluster_still_loads(settings):
    """A reclaim for a MIG job holds its slice (migration 030); recorded as a whole GPU, the hold made every
    later load of the cluster fail ("whole/shared GPU request on a MIG GPU": placement stopped for good)."""
    from gpusched_common.stores.cluster import load_cluster, nominate

    conn = await connect(settings.database_url)
    try:
        plain = node("m1", "A100-80GB", gpus=1)
        registered = plain.model_copy(update={"gpus": [plain.gpus[0].model_copy(update={"mig_enabled": True})]})
        async with conn.transaction():
            await process(conn, registered, NOW, POLICY)
            slot = engine.Decision(engine.RequestId("a1"), "test", True, (engine.Binding(
                engine.NodeId("m1"), (0,), mig=engine.MigPlacement("3g.40gb", 4)),))
            await nominate(conn, "a1", slot, NOW)
        row = await conn.fetchrow("SELECT milli, mig_profile, mig_start FROM gpu_nominations WHERE job_id = 'a1'")
        assert (row["mig_profile"], row["mig_start"]) == ("3g.40gb", 4)
        _, snapshot = await load_cluster(conn)
        [held] = snapshot.allocations[engine.RequestId("nominated-for/a1")]
        assert held.mig == engine.MigPlacement("3g.40gb", 4)
    finally:
        await conn.close()
