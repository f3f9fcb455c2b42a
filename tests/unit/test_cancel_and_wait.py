"""Stopping background tasks always ends: a task that takes a cancel and goes on is cancelled again
(``gpusched_common.tasks.cancel_and_wait``), and the outbox relay's wait for a wake-up gives way to a cancel
that meets the wake-up in the same turn of the loop (on Python 3.11, ``asyncio.wait_for`` there would return
the wake-up and swallow the cancel: the relay ran on and its service's stop waited forever; the last CI run
hung in make test that way)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from gpusched_common.relay import OutboxRelay
from gpusched_common.tasks import cancel_and_wait

ROOT = Path(__file__).resolve().parents[2]


async def test_a_task_that_takes_one_cancel_and_goes_on_is_cancelled_again_and_ends():
    ignored = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if ignored:
                    raise
                ignored.append(True)  # the first cancel is taken and dropped, as 3.11's wait_for may

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], again_after_s=0.05), timeout=5)
    assert task.cancelled() and ignored == [True]


async def test_cancel_and_wait_of_ended_and_no_tasks_returns():
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait([done])
    await cancel_and_wait([])


@pytest.mark.parametrize("turns", range(6))
async def test_a_relay_woken_in_the_turn_it_is_cancelled_stops(turns, monkeypatch):
    relay = OutboxRelay(None, None, "test", poll_interval_s=60.0)  # type: ignore[arg-type]

    async def nothing_to_publish() -> int:
        return 0

    monkeypatch.setattr(relay, "publish_pending", nothing_to_publish)
    pump = asyncio.create_task(relay._pump())
    for _ in range(3):
        await asyncio.sleep(0)  # waiting for a wake-up now
    relay._wake.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    pump.cancel()
    done, _ = await asyncio.wait({pump}, timeout=2.0)
    if not done:  # clean up before failing
        await cancel_and_wait([pump])
    assert done, f"the relay ran on after a cancel {turns} turn(s) after its wake-up"


def _wait_for_calls(path: Path) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"]


def test_no_service_or_library_waits_with_asyncio_wait_for():
    """asyncio.timeout instead: it never swallows a cancel."""
    found = {str(p.relative_to(ROOT)): lines for p in sorted([*(ROOT / "services").rglob("*.py"),
                                                              *(ROOT / "libs").rglob("*.py")])
             if "egg-info" not in str(p) and (lines := _wait_for_calls(p))}
    assert found == {}
