"""Recovery from the store alone (issue 15), on real PostgreSQL: what a lost message would have done, the
periodic passes of placement and quota do, once the job's stream has been still for their settling time;
and what the messages do afterwards changes nothing more."""

from __future__ import annotations

import json
from datetime import timedelta

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_core.placement.drift import DRIFT_WINDOW_S
from services.placement import recovery as placement_recovery
from services.placement.handlers import run_cycle
from services.quota import recovery as quota_recovery
from tests.builders import T0
from tests.integration.test_placement_leases import POLICY, apply, heartbeat, history, queue_job, registered
from tests.integration.test_quota_policy_live import put_in_force, submit

SETTLED = T0 + timedelta(seconds=placement_recovery.SETTLE_S + 1)
LATER = T0 + timedelta(seconds=31)


async def commands(conn, node: str, kind: str) -> list[dict]:
    rows = await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' AND key = $1"
                            " ORDER BY id", node)
    return [m["payload"] for m in (json.loads(bytes(r["value"])) for r in rows) if m["type"] == kind]


async def decide(conn, job_id: str, command, now=T0) -> None:
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, command, now), producer="test", now=now)


async def running_on_n1(conn, job_id: str = "j1", gpus: int = 2) -> None:
    """Node n1 registered, and ``job_id`` placed there and started."""
    async with conn.transaction():
        await apply(conn, registered("n1"), T0)
        await apply(conn, await queue_job(conn, job_id, gpus), T0)
        await decide(conn, job_id, lifecycle.RecordStart("n1", 7, T0))


async def recover(conn, now, **kw) -> placement_recovery.Recovered:
    async with conn.transaction():
        done = await placement_recovery.recover(conn, now, resend_s=30.0, **kw)
        await run_cycle(conn, now, POLICY)
    return done


async def test_a_job_queued_whose_reservation_placement_never_heard_of_is_placed(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1"), T0)
            reserved = await queue_job(conn, "j1", 2)  # QuotaReserved recorded; the message never reached placement
        assert (await recover(conn, T0 + timedelta(seconds=1))).queued == []  # still settling: messages first
        assert (await recover(conn, SETTLED)).queued == ["j1"]
        assert (await history(conn, "j1"))[-1] == ("JobPlaced", "n1")
        assert (await recover(conn, SETTLED + timedelta(seconds=30))).queued == []  # placed: nothing more
        async with conn.transaction():  # the lost message, delivered late after all: nothing new
            await apply(conn, reserved, SETTLED)
        assert [t for t, _ in await history(conn, "j1")].count("JobPlaced") == 1
    finally:
        await conn.close()


async def test_gpus_held_for_a_job_whose_stream_ended_without_placement_are_released_and_its_node_told(database_url):
    conn = await connect(database_url)
    try:
        await running_on_n1(conn)
        async with conn.transaction():
            # the job's stream moved on to its end without placement's allocations (an exit recorded by
            # another writer, a repair): nothing will ever release them but the store's own pass
            await decide(conn, "j1", lifecycle.RecordExit("n1", 0, 1.0))
        assert (await load_job(conn, "j1")).status == lifecycle.JobStatus.SUCCEEDED
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 2
        done = await recover(conn, SETTLED)
        assert done.released == ["j1"]
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
        assert [c["job_id"] for c in await commands(conn, "n1", "StopJob")] == ["j1"]
    finally:
        await conn.close()


async def test_a_cancel_whose_stop_was_lost_is_sent_again_once_per_interval(database_url):
    conn = await connect(database_url)
    try:
        await running_on_n1(conn)
        async with conn.transaction():
            await decide(conn, "j1", lifecycle.Cancel("user asked", requested_by="test"))
        assert (await load_job(conn, "j1")).cancel is not None
        sent: dict = {}
        assert (await recover(conn, T0 + timedelta(seconds=20), stops_sent=sent)).stops == []
        at = T0 + timedelta(seconds=31)
        assert (await recover(conn, at, stops_sent=sent)).stops == ["j1"]
        assert (await recover(conn, at + timedelta(seconds=5), stops_sent=sent)).stops == []
        assert (await recover(conn, at + timedelta(seconds=31), stops_sent=sent)).stops == ["j1"]
        assert len(await commands(conn, "n1", "StopJob")) == 2
        async with conn.transaction():  # the exit comes: the job ends Cancelled, nothing more is sent
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=143, runtime_s=1.0,
                                                 lease_epoch=1, reason_code="stopped", attempt=1), at)
        assert (await load_job(conn, "j1")).status == lifecycle.JobStatus.CANCELLED
        assert (await recover(conn, at + timedelta(seconds=120), stops_sent=sent)).stops == []
        assert sent == {}
    finally:
        await conn.close()


async def test_a_node_s_account_older_than_a_start_or_an_end_the_store_recorded_is_not_drift(database_url):
    """A heartbeat taken before a job started cannot list it, nor one taken before a job ended leave it out
    (issue 16): each job is judged against an account the store recorded after the job's own last change."""
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1"), T0)
            await apply(conn, await queue_job(conn, "j1", 1), T0)
        beat = heartbeat("n1")
        async with conn.transaction():  # the node's account: nothing running yet
            await apply(conn, beat.model_copy(update={"running_jobs": []}), LATER)
        async with conn.transaction():  # the start, recorded after that heartbeat
            await apply(conn, ev.JobStartReported(job_id="j1", node_id="n1", pid=7, started_at=LATER, lease_epoch=1,
                                                  attempt=1), LATER + timedelta(seconds=1))
        for seconds in (2, 2 + DRIFT_WINDOW_S, 3 + 2 * DRIFT_WINDOW_S):  # the next heartbeat is late: no drift
            assert (await recover(conn, LATER + timedelta(seconds=seconds))).reconciled == []
        # a heartbeat after the start that lacks the job: drift, reconciled once the window has passed
        at = LATER + timedelta(seconds=40)
        async with conn.transaction():
            await apply(conn, beat.model_copy(update={"running_jobs": []}), at)
        assert (await recover(conn, at)).reconciled == []
        async with conn.transaction():  # and the one after it
            await apply(conn, beat.model_copy(update={"running_jobs": []}), at + timedelta(seconds=5))
        assert (await recover(conn, at + timedelta(seconds=DRIFT_WINDOW_S))).reconciled == ["n1"]
        # the job ends after a heartbeat that lists it: not run unexpectedly while that account is the latest
        end = at + timedelta(seconds=60)
        async with conn.transaction():
            await apply(conn, beat.model_copy(update={"running_jobs": ["j1"]}), end)
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=0, runtime_s=1.0,
                                                 lease_epoch=1, attempt=1), end + timedelta(seconds=1))
        for seconds in (2, 2 + DRIFT_WINDOW_S, 3 + 2 * DRIFT_WINDOW_S):
            assert (await recover(conn, end + timedelta(seconds=seconds))).reconciled == []
    finally:
        await conn.close()


async def test_a_node_that_lost_an_exit_report_or_runs_an_unexpected_job_is_reconciled(database_url):
    conn = await connect(database_url)
    try:  # (its registration was answered with a ReconcileJobs: none again within 30 s of it)
        async with conn.transaction():
            await apply(conn, registered("n1"), T0)
            await apply(conn, await queue_job(conn, "j1", 1), T0)
            await apply(conn, ev.JobStartReported(job_id="j1", node_id="n1", pid=7, started_at=T0, lease_epoch=1,
                                                  attempt=1), T0)
        beat = heartbeat("n1").model_copy(update={"running_jobs": ["j1"]})
        async with conn.transaction():
            await apply(conn, beat, T0)
        assert (await recover(conn, LATER)).reconciled == []  # it runs what the store expects
        # its exit report was lost: the node says it runs nothing, the store still has it running
        async with conn.transaction():
            await apply(conn, beat.model_copy(update={"running_jobs": ["stray"]}), LATER)
        assert (await recover(conn, LATER)).reconciled == []  # drift first seen
        assert (await recover(conn, LATER + timedelta(seconds=DRIFT_WINDOW_S / 2))).reconciled == []
        at = LATER + timedelta(seconds=DRIFT_WINDOW_S)
        assert (await recover(conn, at)).reconciled == []  # no account since it was first seen (one may race)
        async with conn.transaction():  # the next heartbeat says the same
            await apply(conn, beat.model_copy(update={"running_jobs": ["stray"]}), at)
        # placement behind on the node reports: the account it has may be an old one; nothing is sent
        assert (await recover(conn, at, drift=False)).reconciled == []
        assert (await recover(conn, at)).reconciled == ["n1"]
        *_at_registration, reconcile = await commands(conn, "n1", "ReconcileJobs")
        assert (reconcile["job_ids"], reconcile["lease_epoch"]) == (["j1"], 1)
        assert (await recover(conn, at + timedelta(seconds=DRIFT_WINDOW_S + 1))).reconciled == []  # once per 30 s
        async with conn.transaction():  # heartbeats go on saying the same
            await apply(conn, beat.model_copy(update={"running_jobs": ["stray"]}), at + timedelta(seconds=20))
        assert (await recover(conn, at + timedelta(seconds=31))).reconciled == ["n1"]
        async with conn.transaction():  # the report, sent again, arrives: no drift any more
            await apply(conn, ev.JobExitReported(job_id="j1", node_id="n1", exit_code=0, runtime_s=1.0,
                                                 lease_epoch=1, attempt=1), at)
            await apply(conn, beat.model_copy(update={"running_jobs": []}), at)
        assert (await recover(conn, at + timedelta(seconds=120))).reconciled == []
        assert (await load_job(conn, "j1")).status == lifecycle.JobStatus.SUCCEEDED
    finally:
        await conn.close()


async def test_quota_queues_an_admitted_job_it_never_heard_of_and_gives_back_what_ended_jobs_hold(database_url):
    conn = await connect(database_url)
    try:
        await put_in_force(conn)
        tenancies = TenancyStore()
        async with conn.transaction():
            await submit(conn, "a1", "team-a", 1)  # JobAdmitted recorded; the message was lost
        async with conn.transaction():
            assert (await quota_recovery.recover(conn, tenancies, T0 + timedelta(seconds=1)))["queued"] == []
            assert (await quota_recovery.recover(conn, tenancies, SETTLED))["queued"] == ["a1"]
            assert (await quota_recovery.recover(conn, tenancies, SETTLED))["queued"] == []  # in line once
        assert await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE job_id = 'a1'") == 1

        async with conn.transaction():  # reserved, then it ended and that message was lost
            await conn.execute("DELETE FROM quota_policy_pending WHERE job_id = 'a1'")
            await conn.execute("INSERT INTO quota_policy_reservations (job_id, tenant, flavor, units)"
                               " VALUES ('a1', 'team-a', 'A100-80GB', 1000)")
            await conn.execute("UPDATE quota_policy_usage SET reserved_units = 1000 WHERE tenant = 'team-a'")
            await decide(conn, "a1", lifecycle.ReserveQuota(1, 2))
            await decide(conn, "a1", lifecycle.Cancel("ended", requested_by="test"))
        async with conn.transaction():
            done = await quota_recovery.recover(conn, tenancies, SETTLED)
        assert done["released"] == ["a1"]
        assert await conn.fetchval("SELECT reserved_units FROM quota_policy_usage WHERE tenant = 'team-a'") == 0
        assert await conn.fetchval("SELECT count(*) FROM quota_policy_reservations") == 0
        assert [t for t in [s["type"] for s in await conn.fetch(
            "SELECT type FROM events WHERE stream_id = 'job-a1' ORDER BY version")]][-1] == "QuotaReleased"
    finally:
        await conn.close()


async def test_epochs_are_the_store_s_a_wiped_agent_counting_from_one_is_told_the_epoch_to_register_at(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=3), T0)
            await apply(conn, await queue_job(conn, "j1", 1), T0)
        async with conn.transaction():  # the agent's directory was wiped: it registers at 1 again
            await apply(conn, registered("n1", epoch=1), T0)
            await apply(conn, heartbeat("n1", epoch=1), T0)
        [refused] = await commands(conn, "n1", "NodeLost")
        assert (refused["lease_epoch"], refused["next_epoch"]) == (1, 4)
        assert await conn.fetchval("SELECT lease_epoch FROM nodes WHERE node_id = 'n1'") == 3  # not rolled back
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=4), T0)
        assert await conn.fetchval("SELECT lease_epoch FROM nodes WHERE node_id = 'n1'") == 4
        *_, answer = await commands(conn, "n1", "ReconcileJobs")
        assert (answer["lease_epoch"], answer["job_ids"]) == (4, ["j1"])  # the agent reports j1 missing
        async with conn.transaction():  # a node declared lost at 4 must come back above it
            await conn.execute("UPDATE nodes SET status = 'Lost', lost_epoch = 4 WHERE node_id = 'n1'")
            await apply(conn, registered("n1", epoch=4), T0)
        assert (await commands(conn, "n1", "NodeLost"))[-1]["next_epoch"] == 5
    finally:
        await conn.close()


async def test_a_node_back_with_fewer_gpus_gets_nothing_placed_on_the_ones_it_lost(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=1, gpus=4), T0)
            await apply(conn, registered("n1", epoch=2, gpus=2), T0)  # came back with two
            await apply(conn, await queue_job(conn, "j3", 3), T0)
        assert (await history(conn, "j3"))[-1][0] == "PlacementDeferred"
        assert await conn.fetchval("SELECT count(*) FROM gpus WHERE node_id = 'n1' AND healthy") == 2
        async with conn.transaction():
            await apply(conn, registered("n1", epoch=3, gpus=4), T0)  # all four again
            await run_cycle(conn, T0, POLICY)
        assert (await history(conn, "j3"))[-1] == ("JobPlaced", "n1")
    finally:
        await conn.close()


async def _send_beats(bootstrap: str, nodes: tuple[str, ...]) -> None:
    """A heartbeat's worth of bytes on the node reports topic from each of ``nodes``."""
    from aiokafka import AIOKafkaProducer

    from gpusched_common.topics import NODES_REPORTS

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for node in nodes:
            await producer.send_and_wait(NODES_REPORTS.name, b"beat", key=node.encode())
    finally:
        await producer.stop()


async def _read_and_commit(bootstrap: str, group: str, count: int) -> None:
    """Read ``count`` node reports as consumer group ``group`` and commit where it got to."""
    from aiokafka import AIOKafkaConsumer

    from gpusched_common.topics import NODES_REPORTS

    consumer = AIOKafkaConsumer(NODES_REPORTS.name, bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        read = 0
        while read < count:
            read += sum(len(b) for b in (await consumer.getmany(timeout_ms=1000)).values())
        await consumer.commit()
    finally:
        await consumer.stop()


async def test_the_backlog_of_node_reports_is_read_before_anyone_is_declared_lost(topics):
    from gpusched_common.kafka_admin import group_backlog
    from gpusched_common.topics import NODES_REPORTS
    from gpusched_core.placement.leases import caught_up

    await _send_beats(topics, ("n1", "n2", "n3"))
    options = {"bootstrap_servers": topics}
    barrier, committed = await group_backlog(options, NODES_REPORTS.name, "placement-like")
    assert sum(barrier.values()) == 3 and committed == {}
    assert not caught_up(barrier, committed)  # three heartbeats wait: placement is behind
    await _read_and_commit(topics, "placement-like", 3)
    _, committed = await group_backlog(options, NODES_REPORTS.name, "placement-like")
    assert caught_up(barrier, committed)


async def test_resends_and_reconciliations_wait_until_placement_has_read_the_node_reports(topics):
    """`ReportsRead`: placement acts on the nodes' accounts (StartJobs re-sent, drifted nodes reconciled)
    only once it has read every node report that was in the broker at its previous pass."""
    from gpusched_common.topics import GROUP_PLACEMENT_NODES
    from services.placement.app import ReportsRead

    reports = ReportsRead({"bootstrap_servers": topics})
    assert not await reports.check()  # no earlier pass: nothing is known to be read
    await _send_beats(topics, ("n1", "n2", "n3"))
    assert await reports.check()  # what was there at the first pass (nothing) is read
    assert not await reports.check()  # the three reports there at the second pass are not
    await _read_and_commit(topics, GROUP_PLACEMENT_NODES, 3)
    assert await reports.check() and reports.current
    gone = ReportsRead({"bootstrap_servers": "127.0.0.1:1", "request_timeout_ms": 1000})
    assert not await gone.check()  # a broker that does not answer: nothing is known to be read
