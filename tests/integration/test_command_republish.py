"""Which node commands placement's relay publishes again after the broker lost its data (issue 15), judged
from the real store: after a Tansu restart the chaos campaign's relay sent 1,052 commands of the last 15
minutes again, every agent read every one, and the probe's StartJob waited 11 s behind them."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

from gpusched_common import events as ev
from gpusched_common.db import create_pool
from gpusched_common.relay import OutboxRelay
from gpusched_common.topics import NODES_COMMANDS

from services.placement.republish import commands_done


def _start(job: str, node: str, attempt: int = 1) -> ev.StartJob:
    return ev.StartJob(job_id=job, node_id=node, tenant="t", gpu_indices=[0], gpu_uuids=["GPU-0"], command=["true"],
                       attempt=attempt)


async def test_only_the_commands_with_work_left_are_published_again(database_url):
    now = datetime.now(timezone.utc)
    pool = await create_pool(database_url)
    try:
        await pool.execute("INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend,"
                           " registered_at, last_seen_at) VALUES ('n1', 'sim', '{}', 32000, 262144, 'simulated', $1, $1)",
                           now)
        await pool.execute("INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib)"
                           " VALUES ('n1', 0, 'GPU-0', 'H100-80GB', 81559)")
        await pool.execute("INSERT INTO gpu_allocations VALUES ('n1', 0, 'still-running', $1)", now)
        pending = _start("not-started", "n1", attempt=2)
        await pool.execute("INSERT INTO placement_starts (job_id, node_id, attempt, payload, sent_at)"
                           " VALUES ('not-started', 'n1', 2, $1, $2)", json.dumps(pending.model_dump(mode="json")), now)
        commands = [
            ("started", _start("started", "n1")),  # acknowledged: its row is gone
            ("first-run", _start("not-started", "n1", attempt=1)),  # an earlier run of the job
            ("pending", pending),
            ("reconcile-1", ev.ReconcileJobs(node_id="n1", job_ids=[])),
            ("stop-held", ev.StopJob(job_id="still-running", node_id="n1", reason="cancelled")),
            ("stop-ended", ev.StopJob(job_id="gone", node_id="n1", reason="cancelled")),
            ("preempt-ended", ev.PreemptJob(job_id="gone", node_id="n1", grace_s=1.0, deadline_at=now, reason="r")),
            ("reconcile-2", ev.ReconcileJobs(node_id="n1", job_ids=["still-running"])),
            ("resent", pending),  # the periodic re-send of the pending start: the latest of that run goes
            ("unreadable", None),
        ]
        ids = {}
        for name, payload in commands:
            value = b"{not json" if payload is None else ev.make_envelope(
                payload, event_id=str(uuid.uuid4()), stream_id="node-n1", occurred_at=now,
                producer="placement").model_dump_json().encode()
            ids[name] = await pool.fetchval("INSERT INTO outbox (producer, topic, key, headers, value)"
                                            " VALUES ('placement', $1, 'n1', '{}', $2) RETURNING id",
                                            NODES_COMMANDS.name, value)
        other_topic = await pool.fetchval("INSERT INTO outbox (producer, topic, key, headers, value) VALUES"
                                          " ('placement', 'gpusched.jobs.events', 'j', '{}', $1) RETURNING id",
                                          b'{"type": "StartJob", "payload": {"node_id": "n1"}}')
        async with pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, topic, value FROM outbox ORDER BY id")
            done = await commands_done(conn, rows)
        again = {name for name, row_id in ids.items() if row_id not in done} | (
            {"other topic"} if other_topic not in done else set())
        assert again == {"stop-held", "reconcile-2", "resent", "unreadable", "other topic"}

        # the relay uses it: a republish marks only those unpublished again
        relay = OutboxRelay(pool, None, "placement", poll_interval_s=1.0)  # type: ignore[arg-type]
        relay.done_with = commands_done
        await pool.execute("UPDATE outbox SET published_at = clock_timestamp()")
        async with pool.acquire() as conn:
            await relay._republish(conn, ["n1:0 (offset 9 before, 0 now)"], [])
        unpublished = {r["id"] for r in await pool.fetch("SELECT id FROM outbox WHERE published_at IS NULL")}
        assert unpublished == {ids["stop-held"], ids["reconcile-2"], ids["resent"], ids["unreadable"], other_topic}
    finally:
        await pool.close()
