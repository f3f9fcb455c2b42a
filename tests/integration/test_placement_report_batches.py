"""Placement's node reports a consumer batch at a time, on real PostgreSQL: a batch's heartbeats renew leases in
one update; its starts and one-node ends are written together at its end, in order with what reads their jobs
again, and its cycle places on the GPUs its ends gave back."""

from __future__ import annotations

import uuid
from datetime import timedelta

from gpusched_common import events as ev
from gpusched_common.batching import Batch
from gpusched_common.db import connect
from gpusched_common.messaging import Incoming
from gpusched_common.topics import NODES_REPORTS
from tests.builders import T0
from tests.integration.test_placement_leases import POLICY, apply, heartbeat, history, queue_job, registered


async def apply_as_batch(conn, handler, payloads) -> None:
    """Node reports through placement's handler as one consumer batch in one transaction."""
    messages = []
    for offset, payload in enumerate(payloads):
        envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{payload.node_id}",
                                    occurred_at=T0, producer="node-agent")
        messages.append(Incoming(NODES_REPORTS.name, 0, offset, payload.node_id, envelope.model_dump_json().encode(),
                                 {}))
    batch = Batch(tuple(messages))
    async with conn.transaction():
        for message in messages:
            await handler(conn, message, batch)
        await batch.finish(conn)


async def test_a_batch_of_heartbeats_renews_every_lease_in_one_update_and_keeps_the_guards(database_url):
    """A batch's heartbeats are written at its end in one statement: of a node's beats the later one
    counts (its running jobs), a beat of a newer epoch moves the lease on, and a beat of an epoch declared
    lost renews nothing."""
    from gpusched_common.stores.cluster import ClusterCache
    from services.placement.handlers import make_handler

    later = T0 + timedelta(seconds=20)
    handler = make_handler(lambda: later, POLICY, ClusterCache(), accept_unsigned=True)
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            for node in ("n1", "n2", "n3"):
                await apply(conn, registered(node), T0)
        await conn.execute("UPDATE nodes SET lost_epoch = 1 WHERE node_id = 'n3'")
        beats = [heartbeat("n1").model_copy(update={"running_jobs": ["a"]}),
                 heartbeat("n2", epoch=2),
                 heartbeat("n1").model_copy(update={"running_jobs": ["a", "b"]}),
                 heartbeat("n3"),
                 heartbeat("n2", epoch=1)]  # older than the batch's other beat of n2
        await apply_as_batch(conn, handler, beats)
        rows = {r["node_id"]: r for r in await conn.fetch(
            "SELECT node_id, last_seen_at, lease_epoch, reported_jobs FROM nodes")}
        assert rows["n1"]["last_seen_at"] == later and rows["n1"]["reported_jobs"] == ["a", "b"]
        assert (rows["n2"]["last_seen_at"], rows["n2"]["lease_epoch"]) == (later, 2)
        assert rows["n3"]["last_seen_at"] != later
    finally:
        await conn.close()


async def test_a_batch_of_start_reports_is_written_together_and_in_order_with_what_follows(database_url):
    """A batch of node reports records its starts at its end, all together (and their StartJobs as answered),
    but before anything that reads the job again: a run's exit in the same batch follows its start, a start
    reported twice is one JobStarted, and a report from an epoch declared lost changes nothing."""
    from gpusched_common.stores.cluster import ClusterCache
    from services.placement.handlers import make_handler

    def started(job_id, node):
        return ev.JobStartReported(job_id=job_id, node_id=node, pid=100, started_at=T0, lease_epoch=1, attempt=1)

    handler = make_handler(lambda: T0, POLICY, ClusterCache(), accept_unsigned=True)
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            for node in ("n1", "n2", "n3", "n4"):  # a node each
                await apply(conn, registered(node), T0)
            for job_id in ("a", "b", "c", "d"):
                await apply(conn, await queue_job(conn, job_id, 2), T0)
        placed = {r["job_id"]: r["node_id"] for r in await conn.fetch("SELECT job_id, node_id FROM placement_starts")}
        assert sorted(placed) == ["a", "b", "c", "d"]
        lost = placed["d"]
        await conn.execute("UPDATE nodes SET lost_epoch = 1 WHERE node_id = $1", lost)
        payloads = [started("a", placed["a"]), started("b", placed["b"]),
                    ev.JobExitReported(job_id="b", node_id=placed["b"], exit_code=0, runtime_s=1.0, lease_epoch=1,
                                       attempt=1),
                    started("c", placed["c"]), started("a", placed["a"]), started("d", lost)]
        await apply_as_batch(conn, handler, payloads)
        assert [t for t, _ in await history(conn, "a")][-2:] == ["JobPlaced", "JobStarted"]
        assert [t for t, _ in await history(conn, "b")][-2:] == ["JobStarted", "JobSucceeded"]
        assert [t for t, _ in await history(conn, "c")][-1] == "JobStarted"
        assert [t for t, _ in await history(conn, "d")][-1] == "JobPlaced"  # its node's epoch was declared lost
        left = {r["job_id"] for r in await conn.fetch("SELECT job_id FROM placement_starts")}
        assert left == {"d"}  # the others' StartJobs are answered: never sent again
    finally:
        await conn.close()


async def test_a_batch_of_exit_reports_gives_gpus_back_together_before_its_cycle(database_url):
    """A batch of node reports records its one-node jobs' ends at its end, all together, and its cycle then
    places the jobs that waited on the GPUs they gave back; a start and an exit of one run in the same batch
    keep their order, an exit reported twice is one end, and an exit from an epoch declared lost, or one that
    asks for a requeue, is decided as before."""
    from gpusched_common.stores.cluster import ClusterCache
    from services.placement.handlers import make_handler

    def started(job_id, node):
        return ev.JobStartReported(job_id=job_id, node_id=node, pid=100, started_at=T0, lease_epoch=1, attempt=1)

    def exited(job_id, node, code=0, reason_code=None):
        return ev.JobExitReported(job_id=job_id, node_id=node, exit_code=code, runtime_s=1.0, lease_epoch=1,
                                  attempt=1, reason_code=reason_code)

    handler = make_handler(lambda: T0, POLICY, ClusterCache(), accept_unsigned=True)
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            for node in ("n1", "n2", "n3", "n4", "n5"):
                await apply(conn, registered(node), T0)
            for job_id in ("a", "b", "c", "d", "e", "w1", "w2", "w3"):  # five fill the cluster, three wait
                await apply(conn, await queue_job(conn, job_id, 2), T0)
        placed = {r["job_id"]: r["node_id"] for r in await conn.fetch("SELECT job_id, node_id FROM placement_starts")}
        assert sorted(placed) == ["a", "b", "c", "d", "e"]
        await apply_as_batch(conn, handler, [started(j, placed[j]) for j in ("a", "b", "c", "d")])
        lost = placed["d"]
        await conn.execute("UPDATE nodes SET lost_epoch = 1 WHERE node_id = $1", lost)
        payloads = [exited("a", placed["a"]), exited("b", placed["b"], code=3), exited("a", placed["a"]),
                    started("e", placed["e"]), exited("e", placed["e"]),
                    exited("c", placed["c"], code=137, reason_code="gpu_unhealthy"), exited("d", lost)]
        await apply_as_batch(conn, handler, payloads)
        assert [t for t, _ in await history(conn, "a")][-2:] == ["JobStarted", "JobSucceeded"]
        assert [t for t, _ in await history(conn, "b")][-2:] == ["JobStarted", "JobFailed"]
        assert [t for t, _ in await history(conn, "e")][-2:] == ["JobStarted", "JobSucceeded"]
        assert [t for t, _ in await history(conn, "c")][-2:-1] == ["JobRequeued"]  # queued again, placed again
        assert [t for t, _ in await history(conn, "d")][-1] == "JobStarted"  # its node's epoch was declared lost
        held = {r["job_id"] for r in await conn.fetch("SELECT DISTINCT job_id FROM gpu_allocations")}
        # a, b, e and the requeued c gave their nodes back in the batch; its one cycle placed the three waiting
        # jobs and c on them
        assert held == {"c", "d", "w1", "w2", "w3"}
    finally:
        await conn.close()
