"""A preemption no exit answered (issue 15): a victim still Preempting past its grace and a settling time is
asked again (a PreemptJob to every node of its run, once per settling time), and no more once its exit
came."""

from __future__ import annotations

import json
from datetime import timedelta

from gpusched_core import lifecycle
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from services.preemption.stuck import SETTLE_S, StuckPreemptions
from tests.builders import T0, a_job


async def decide(conn, job_id: str, command, now) -> None:
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, command, now), producer="test", now=now)


async def preempt_commands_sent(conn) -> list[dict]:
    rows = await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' ORDER BY id")
    return [m["payload"] for m in (json.loads(bytes(r["value"])) for r in rows) if m["type"] == "PreemptJob"]


async def test_a_victim_no_exit_was_reported_for_is_asked_again_until_it_ends(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await decide(conn, "v1", lifecycle.RegisterSubmission(a_job("v1").gpus(2).spec(), T0), T0)
            await decide(conn, "v1", lifecycle.ReserveQuota(2, 8), T0)
            await decide(conn, "v1", lifecycle.Place("n1", (0, 1), ("u0", "u1"), "H100-80GB", "bestfit", "fits"), T0)
            await decide(conn, "v1", lifecycle.RecordStart("n1", 7, T0), T0)
            await decide(conn, "v1", lifecycle.RequestPreemption("p1", 100, "research", "urgent work", 30.0,
                                                                 T0 + timedelta(seconds=30)), T0)
        assert (await load_job(conn, "v1")).status == lifecycle.JobStatus.PREEMPTING
        stuck = StuckPreemptions()
        async with conn.transaction():
            assert await stuck.ask_again(conn, T0 + timedelta(seconds=40), grace_s=30.0) == []  # within its grace
        later = T0 + timedelta(seconds=30 + SETTLE_S + 1)
        async with conn.transaction():
            assert await stuck.ask_again(conn, later, grace_s=30.0) == ["v1"]
            assert await stuck.ask_again(conn, later + timedelta(seconds=1), grace_s=30.0) == []  # once per settle
        sent = await preempt_commands_sent(conn)
        assert [(c["job_id"], c["node_id"], c["grace_s"]) for c in sent] == [("v1", "n1", 0.0)]
        async with conn.transaction():
            await decide(conn, "v1", lifecycle.RecordExit("n1", 137, 60.0), later)
            assert await stuck.ask_again(conn, later + timedelta(seconds=SETTLE_S * 3), grace_s=30.0) == []
    finally:
        await conn.close()
