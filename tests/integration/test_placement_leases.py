"""Placement's side of node leases and GPU health, on real PostgreSQL: a silent node is declared lost
once, its jobs are requeued exactly once and placed elsewhere, and late reports from it change nothing."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.batching import Batch
from gpusched_common.db import connect
from gpusched_common.messaging import Incoming
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import placement as engine
from services.placement.handlers import check_leases, process

POLICY = engine.make_policy("bestfit")


async def apply(conn, payload, now):
    await process(conn, payload, now, POLICY)
from tests.builders import T0, a_job


def registered(node: str, epoch: int = 1, gpus: int = 2) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        node_id=node, hostname=node, cpu_milli=1000, memory_mib=1024, nvml_backend="simulated", lease_epoch=epoch,
        gpus=[ev.GpuInventory(index=i, uuid=f"{node}-{i}", model="H100-80GB", memory_mib=81559) for i in range(gpus)])


def heartbeat(node: str, epoch: int = 1) -> ev.NodeHeartbeat:
    return ev.NodeHeartbeat(node_id=node, running_jobs=[], lease_epoch=epoch, lease_ttl_s=30, fence_grace_s=10)


async def queue_job(conn, job_id: str, gpus: int) -> ev.QuotaReserved:
    spec = a_job(job_id).gpus(gpus).spec()
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0), T0),
                                    producer="test", now=T0)
    events = lifecycle.decide(state, lifecycle.ReserveQuota(gpus, 8), T0)
    await append_job_events(conn, state, events, producer="test", now=T0)
    return events[0]


async def place_j1_on_n1(conn) -> None:
    """One node, n1, with its lease; a two-GPU job j1 reserved and placed there."""
    async with conn.transaction():
        await apply(conn, registered("n1"), T0)
        await apply(conn, heartbeat("n1"), T0)
        await apply(conn, await queue_job(conn, "j1", 2), T0)


async def history(conn, job_id: str) -> list[tuple[str, str | None]]:
    rows = await conn.fetch("SELECT type, payload->>'node_id' AS node FROM events WHERE stream_id = $1"
                            " ORDER BY version", f"job-{job_id}")
    return [(r["type"], r["node"]) for r in rows]

async def test_a_lost_node_has_its_jobs_requeued_once_and_placed_elsewhere(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1"), T0)
            await apply(conn, registered("n2"), T0)
            await apply(conn, heartbeat("n1"), T0)
            await apply(conn, heartbeat("n2"), T0)
            await apply(conn, await queue_job(conn, "j1", 2), T0)
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")

        later = T0 + timedelta(seconds=45)
        async with conn.transaction():
            await apply(conn, heartbeat("n2"), T0 + timedelta(seconds=35))  # n2 keeps its lease
            assert await check_leases(conn, later, POLICY) == ["n1"]
        async with conn.transaction():
            assert await check_leases(conn, later + timedelta(seconds=5), POLICY) == []
        told = [json.loads(bytes(r["value"])) for r in await conn.fetch(
            "SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' AND key = 'n1' ORDER BY id")]
        assert [(m["payload"]["lease_epoch"], m["payload"]["reason"]) for m in told if m["type"] == "NodeLost"] == \
            [(1, "silent for 45s")]  # the node is told once, so an agent that was only slow comes back
        assert [t for t, _ in await history(conn, "j1")][-3:] == ["JobPlaced", "JobRequeued", "JobPlaced"]
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n2")

        # the fenced agent of n1 reports the exit of the job it stopped: stale epoch, ignored
        async with conn.transaction():
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=137, runtime_s=1.0,
                                                 lease_epoch=1, reason_code="lease_lost"), later)
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n2", exit_code=0, runtime_s=1.0,
                                                 lease_epoch=1), later)
        types = [t for t, _ in await history(conn, "j1")]
        assert types.count("JobRequeued") == 1 and types[-1] == "JobSucceeded"
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
        # n1 comes back with a new epoch and is schedulable again
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=2), later)
        assert await conn.fetchval("SELECT status FROM nodes WHERE node_id = 'n1'") == "Ready"
    finally:
        await conn.close()


async def test_an_unhealthy_gpu_is_cordoned_and_its_job_requeued(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", gpus=2), T0)
            await apply(conn, await queue_job(conn, "j1", 1), T0)
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")
        async with conn.transaction():
            await apply(conn, ev.GpuHealthChanged(node_id="n1", gpu_index=0, gpu_uuid="n1-0", healthy=False,
                                                  status="unhealthy", reasons=["XID 48"], observed_at=T0,
                                                  lease_epoch=1, xid=48, job_ids=["j1"], job_action="stopped"), T0)
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=137, runtime_s=1.0,
                                                 lease_epoch=1, reason_code="gpu_unhealthy"), T0)
        rows = await conn.fetch("SELECT gpu_index FROM gpu_allocations WHERE job_id = 'j1'")
        assert [r["gpu_index"] for r in rows] == [1]  # placed again, never on the cordoned GPU
        assert [t for t, _ in await history(conn, "j1")][-2:] == ["JobRequeued", "JobPlaced"]
    finally:
        await conn.close()


async def test_a_reservation_charged_to_a_gpu_model_binds_the_job_to_it(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", gpus=2), T0)  # H100 node
            reserved = await queue_job(conn, "j1", 1)
            await apply(conn, reserved.model_copy(update={"gpu_model": "A100-80GB"}), T0)
        assert [t for t, _ in await history(conn, "j1")][-1] == "PlacementDeferred"  # no A100 here
    finally:
        await conn.close()


async def test_a_requeued_job_stays_on_the_gpu_model_its_quota_was_charged_for(database_url):
    def node(name: str, model: str) -> ev.NodeRegistered:
        return registered(name).model_copy(update={"gpus": [
            ev.GpuInventory(index=i, uuid=f"{name}-{i}", model=model, memory_mib=81920) for i in range(2)]})

    conn = await connect(database_url)
    try:
        async with conn.transaction():
            for name, model in (("n1", "H100-80GB"), ("n2", "A100-80GB"), ("n3", "H100-80GB")):
                await apply(conn, node(name, model), T0)
                await apply(conn, heartbeat(name), T0)
            spec = a_job("j1").gpus(2).spec()  # names no model: quota charged it to H100-80GB
            state = await load_job(conn, "j1")
            state = await append_job_events(conn, state, lifecycle.decide(
                state, lifecycle.RegisterSubmission(spec, T0), T0), producer="test", now=T0)
            reserved = lifecycle.decide(state, lifecycle.ReserveQuota(2, 8, gpu_model="H100-80GB"), T0)
            await append_job_events(conn, state, reserved, producer="test", now=T0)
            await apply(conn, reserved[0], T0)
        first = (await history(conn, "j1"))[-1]
        assert first[0] == "JobPlaced" and first[1] in ("n1", "n3")
        survivor = "n3" if first[1] == "n1" else "n1"
        later = T0 + timedelta(seconds=45)
        async with conn.transaction():
            await apply(conn, heartbeat("n2"), T0 + timedelta(seconds=35))
            await apply(conn, heartbeat(survivor), T0 + timedelta(seconds=35))
            assert await check_leases(conn, later, POLICY) == [first[1]]
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", survivor)  # not the free A100 node
    finally:
        await conn.close()


async def test_gpus_held_for_a_preemptor_that_is_not_placed_on_them_go_back_after_the_ttl(database_url):
    from services.placement.handlers import run_cycle
    from services.placement.store import expire_nominations

    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", gpus=2), T0)
            await apply(conn, heartbeat("n1"), T0)
            # a reclaim held both GPUs for "owner", which still waits for quota (so placement cannot use them)
            await conn.executemany("INSERT INTO gpu_nominations (node_id, gpu_index, job_id, nominated_at)"
                                   " VALUES ('n1', $1, 'owner', $2)", [(0, T0), (1, T0)])
            await apply(conn, await queue_job(conn, "j1", 1), T0)
        assert [t for t, _ in await history(conn, "j1")][-1] == "PlacementDeferred"
        for at, lapsed, last in ((T0 + timedelta(seconds=299), [], "PlacementDeferred"),
                                 (T0 + timedelta(seconds=301), ["owner"], "JobPlaced")):
            async with conn.transaction():
                assert await expire_nominations(conn, at, 300.0) == lapsed
                await run_cycle(conn, at, POLICY)
            assert [t for t, _ in await history(conn, "j1")][-1] == last
        assert await conn.fetchval("SELECT count(*) FROM gpu_nominations") == 0
    finally:
        await conn.close()


async def test_a_forged_job_event_frees_no_gpu_and_places_nothing(database_url):
    """On gpusched.jobs.events a message is a claim that the event store holds it: a JobCancelled nobody
    appended frees no GPU of a placed job; a QuotaReserved nobody appended queues nothing."""
    from gpusched_common.ids import job_stream
    from gpusched_common.stores.cluster import ClusterCache
    from services.placement.handlers import make_handler

    handler = make_handler(lambda: T0, POLICY, ClusterCache())

    async def forge(payload, job_id):
        envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=job_stream(job_id),
                                    occurred_at=T0, producer="admission")
        batch = Batch()
        async with conn.transaction():
            await handler(conn, Incoming("gpusched.jobs.events", 0, 0, job_id, envelope.model_dump_json().encode(),
                                         {}), batch)
            await batch.finish(conn)

    conn = await connect(database_url)
    try:
        await place_j1_on_n1(conn)
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")
        await forge(ev.JobCancelled(job_id="j1", reason="forged"), "j1")
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations WHERE job_id = 'j1'") == 2
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE convert_from(value, 'UTF8') LIKE '%StopJob%'") == 0
        spec = a_job("ghost").gpus(1).spec()
        await forge(ev.QuotaReserved(job_id="ghost", tenant=spec.tenant, gpus=1, spec=spec, gpu_model="H100-80GB",
                                     tenant_reserved_gpus=1, tenant_cap_gpus=8), "ghost")
        assert await conn.fetchval("SELECT count(*) FROM placement_pending WHERE job_id = 'ghost'") == 0
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations WHERE job_id = 'ghost'") == 0
    finally:
        await conn.close()


async def test_an_impossible_node_is_quarantined_and_every_other_node_goes_on(database_url):
    from services.placement.handlers import OUT_OF_RANGE

    bad = registered("n-bad", gpus=3)
    bad = bad.model_copy(update={"gpus": [g.model_copy(update={"index": g.index * 2}) for g in bad.gpus]})  # 0, 2, 4
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1"), T0)
            await apply(conn, heartbeat("n1"), T0)
            await apply(conn, bad, T0)
        row = await conn.fetchrow("SELECT status, quarantine_reasons FROM nodes WHERE node_id = 'n-bad'")
        assert row["status"] == "Quarantined" and "GPU indices [0, 2, 4] are not 0..2" in row["quarantine_reasons"][0]
        assert await conn.fetchval("SELECT count(*) FROM gpus WHERE node_id = 'n-bad'") == 0
        before = OUT_OF_RANGE.total()
        async with conn.transaction():  # a lease of 1e14 s would overflow the lease loop: ignored, counted
            await apply(conn, heartbeat("n1").model_copy(update={"lease_ttl_s": 1e14}), T0)
            await apply(conn, ev.JobStartReported(job_id="j9", node_id="n1", pid=-5, started_at=T0), T0)
        assert OUT_OF_RANGE.total() == before + 2
        assert await conn.fetchval("SELECT lease_ttl_s FROM nodes WHERE node_id = 'n1'") == 30
        async with conn.transaction():
            await check_leases(conn, T0 + timedelta(seconds=10), POLICY)
            await apply(conn, await queue_job(conn, "j1", 2), T0)  # the good node takes work as before
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")
        async with conn.transaction():  # registered again as a real node: Ready, reasons gone
            await apply(conn, registered("n-bad"), T0)
        row = await conn.fetchrow("SELECT status, quarantine_reasons FROM nodes WHERE node_id = 'n-bad'")
        assert (row["status"], row["quarantine_reasons"]) == ("Ready", None)
    finally:
        await conn.close()


async def test_a_job_its_agent_fenced_before_the_node_was_declared_lost_is_requeued_not_failed(database_url):
    """A broker blip longer than the lease: the agent fences itself and reports `lease_lost` while placement
    still holds the node's lease. The job did nothing wrong: it goes back in line and runs again."""
    conn = await connect(database_url)
    try:
        await place_j1_on_n1(conn)
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")
        async with conn.transaction():
            await apply(conn, ev.JobStartReported(job_id="j1", node_id="n1", pid=1, started_at=T0, lease_epoch=1,
                                                  attempt=1), T0)
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=137, runtime_s=30.0,
                                                 lease_epoch=1, reason_code="lease_lost", attempt=1),
                        T0 + timedelta(seconds=31))
        types = [t for t, _ in await history(conn, "j1")]
        assert "JobFailed" not in types and types[-2:] == ["JobRequeued", "JobPlaced"], types
    finally:
        await conn.close()


async def test_placement_that_was_not_listening_declares_nobody_lost_for_its_own_silence(database_url):
    """Placement paused (or its database was down) for longer than every lease: the nodes were not silent,
    placement was. Its first check after the gap gives every node a fresh lease; a node that then stays
    silent for a whole lease is declared lost as ever."""
    conn = await connect(database_url)
    try:
        await place_j1_on_n1(conn)
        back = T0 + timedelta(seconds=120)
        async with conn.transaction():
            assert await check_leases(conn, back, POLICY, away_s=119.0) == []
        async with conn.transaction():
            assert await check_leases(conn, back + timedelta(seconds=1), POLICY, away_s=0.0) == []
        async with conn.transaction():  # still silent a whole lease (30 s + 10 s grace) after placement came back
            assert await check_leases(conn, back + timedelta(seconds=45), POLICY, away_s=0.0) == ["n1"]
        assert "JobRequeued" in [t for t, _ in await history(conn, "j1")]
    finally:
        await conn.close()


async def test_a_start_no_node_acknowledged_is_sent_again_until_its_start_is_reported(database_url):
    from services.placement.starts import resend_unacknowledged

    async def starts_sent() -> list[dict]:
        rows = await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' ORDER BY id")
        return [m["payload"] for m in (json.loads(bytes(r["value"])) for r in rows) if m["type"] == "StartJob"]

    conn = await connect(database_url)
    try:
        await place_j1_on_n1(conn)
        assert len(await starts_sent()) == 1
        async with conn.transaction():  # not yet: the node may still be starting it
            assert await resend_unacknowledged(conn, T0 + timedelta(seconds=10), 30.0) == []
        async with conn.transaction():  # unanswered for longer: sent again, the same run at the node's epoch
            assert await resend_unacknowledged(conn, T0 + timedelta(seconds=31), 30.0) == ["j1"]
        sent = await starts_sent()
        assert len(sent) == 2 and sent[0] == sent[1] and sent[1]["lease_epoch"] == 1
        async with conn.transaction():
            await apply(conn, ev.JobStartReported(job_id="j1", node_id="n1", pid=7, started_at=T0, lease_epoch=1,
                                                  attempt=1), T0 + timedelta(seconds=32))
            assert await resend_unacknowledged(conn, T0 + timedelta(seconds=120), 30.0) == []
        assert len(await starts_sent()) == 2
        assert await conn.fetchval("SELECT count(*) FROM placement_starts") == 0
    finally:
        await conn.close()


async def test_a_start_of_an_earlier_run_is_never_sent_again_once_the_job_was_placed_elsewhere(database_url):
    """j1's first run was placed on n1 and never acknowledged; a bad GPU there sent it back in line and it was
    placed on n2. n1 is still Ready at the same epoch, but the first run's StartJob must never be sent
    again: n1 has no record of j1 and would start it beside its run on n2 (a chaos campaign's double run)."""
    from services.placement.starts import resend_unacknowledged

    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", gpus=2), T0)
            await apply(conn, registered("n2", gpus=2), T0)
            await apply(conn, await queue_job(conn, "j1", 2), T0)
        first = (await history(conn, "j1"))[-1]
        other = "n2" if first[1] == "n1" else "n1"
        async with conn.transaction():
            await apply(conn, ev.GpuHealthChanged(node_id=first[1], gpu_index=0, gpu_uuid=f"{first[1]}-0",
                                                  healthy=False, status="unhealthy", reasons=["XID 48"],
                                                  observed_at=T0, lease_epoch=1, xid=48, job_ids=["j1"],
                                                  job_action="stopped"), T0)
            await apply(conn, ev.JobExitReported(job_id="j1", node_id=first[1], exit_code=137, runtime_s=0.0,
                                                 lease_epoch=1, reason_code="gpu_unhealthy", attempt=1), T0)
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", other)
        async with conn.transaction():
            await resend_unacknowledged(conn, T0 + timedelta(seconds=31), 30.0)
        rows = await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' ORDER BY id")
        sent = [(m["payload"]["node_id"], m["payload"]["attempt"])
                for m in (json.loads(bytes(r["value"])) for r in rows) if m["type"] == "StartJob"]
        assert sent == [(first[1], 1), (other, 2), (other, 2)], sent
    finally:
        await conn.close()


async def test_a_node_registering_again_is_told_each_of_its_jobs_with_the_run_it_is_at(database_url):
    conn = await connect(database_url)
    try:
        await place_j1_on_n1(conn)
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=2), T0 + timedelta(seconds=5))
        rows = await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' ORDER BY id")
        answers = [m["payload"] for m in (json.loads(bytes(r["value"])) for r in rows) if m["type"] == "ReconcileJobs"]
        assert answers[-1]["job_ids"] == ["j1"] and answers[-1]["attempts"] == {"j1": 1}, answers
    finally:
        await conn.close()
