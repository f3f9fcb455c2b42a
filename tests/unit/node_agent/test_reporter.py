"""How queued reports leave the node: in order, each until the broker takes it, and never stuck behind a send
the Kafka client does not answer."""

from __future__ import annotations

import asyncio
import json

from gpusched_common import events as ev

from services.node_agent.reporter import Reporter


async def test_a_send_the_client_never_answers_is_tried_again_as_the_same_report_and_the_queue_moves_on():
    """Seen after a broker restart: the registration after a NodeLost waited on a send that never returned
    for 2+ minutes while heartbeats went out, and the node stayed Lost. Each try is bounded; the report is
    sent again with the same event id (a receiver that got both drops one), and what is queued behind it
    follows in order."""
    tries: list[tuple[str, str]] = []
    hung = asyncio.Event()

    async def send(topic: str, key: str, value: bytes, headers: dict[str, str]) -> None:
        message = json.loads(value)
        tries.append((message["type"], message["event_id"]))
        if len(tries) == 1:
            hung.set()
            await asyncio.Event().wait()  # never answered

    reporter = Reporter("n1", send, lambda: False, attempt_timeout_s=0.1)
    reporter.in_order(ev.NodeRegistered(node_id="n1", hostname="n1", gpus=[], cpu_milli=1000, memory_mib=1024,
                                        nvml_backend="simulated", lease_epoch=2))
    reporter.in_order(ev.JobExitReported(job_id="j1", node_id="n1", exit_code=0, runtime_s=1.0, lease_epoch=2))
    await asyncio.wait_for(hung.wait(), 5)
    await asyncio.wait_for(reporter.flush(), 5)
    assert [t for t, _ in tries] == ["NodeRegistered", "NodeRegistered", "JobExitReported"]
    assert tries[0][1] == tries[1][1] != tries[2][1]
    await reporter.close()
