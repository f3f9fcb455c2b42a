"""A hung test ends the run with its stacks instead of running into CI's time limit silently.

Each phase of a test (setup, call, teardown) gets GPUSCHED_TEST_PHASE_LIMIT_S seconds (default 900; the
slowest phase today, an end-to-end module's stack starting, takes about a minute). Past that the watchdog
prints every thread's stack and every asyncio task's stack of the suite's event loop (which shows the await
a hung coroutine waits on; a thread dump alone shows only the loop's select), then interrupts the run: pytest
reports the interrupted test and its summary, and the run fails. The interrupt goes to the main thread, again
every 10 s while the run goes on; if it cannot end the run (the main thread stuck outside Python), the process
exits after GPUSCHED_TEST_INTERRUPT_GRACE_S seconds (default 120).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest

LIMIT_S = float(os.environ.get("GPUSCHED_TEST_PHASE_LIMIT_S", "900"))
GRACE_S = float(os.environ.get("GPUSCHED_TEST_INTERRUPT_GRACE_S", "120"))
AGAIN_S = 10.0  # the interrupt is sent again this often until the run ends

_loop: asyncio.AbstractEventLoop | None = None
_config: pytest.Config | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


@pytest.fixture(scope="session", autouse=True)
async def _watched_loop() -> None:
    """Remember the suite's event loop (session scope), so the watchdog can list its tasks."""
    global _loop
    _loop = asyncio.get_running_loop()


def _report(nodeid: str, phase: str) -> None:
    capture = _config.pluginmanager.getplugin("capturemanager") if _config is not None else None
    if capture is not None:
        capture.suspend_global_capture()  # to the run's own stderr, not the test's captured output
    out = sys.stderr
    print(f"\n\n=== watchdog: {nodeid} ({phase}) still running after {LIMIT_S:.0f} s ===", file=out, flush=True)
    faulthandler.dump_traceback(file=out, all_threads=True)
    loop = _loop
    if loop is not None:
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:  # the set changed while it was read: once more
            tasks = list(asyncio.all_tasks(loop))
        print(f"--- {len(tasks)} asyncio task(s) ---", file=out)
        for task in tasks:
            print(f"* {task.get_name()}:", file=out)
            for line in _awaiting(task.get_coro()):
                print(f"    {line}", file=out)
    print("=== watchdog: interrupting the run ===", file=out, flush=True)


def _awaiting(awaitable: object) -> list[str]:
    """Where a coroutine waits: each frame down its chain of awaits (a task's own stack shows only the first)."""
    lines: list[str] = []
    while awaitable is not None and len(lines) < 60:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None) \
            or getattr(awaitable, "ag_frame", None)
        if frame is None:
            lines.append(f"awaits {awaitable!r}"[:300])
            break
        lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None) \
            or getattr(awaitable, "ag_await", None)
    return lines


def _fire(nodeid: str, phase: str, done: threading.Event) -> None:
    _report(nodeid, phase)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        # to the main thread itself: its select wakes up and pytest stops on the KeyboardInterrupt (a signal
        # sent to the process may be taken by another thread, and the main thread sleeps on)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        if done.wait(min(AGAIN_S, max(0.0, deadline - time.monotonic()))):
            return
    print("=== watchdog: the interrupt did not end the run; exiting ===", file=sys.stderr, flush=True)
    os._exit(3)


def _watch(item: pytest.Item, phase: str) -> Iterator[None]:
    done = threading.Event()
    timer = threading.Timer(LIMIT_S, _fire, (item.nodeid, phase, done))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        done.set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _watch(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _watch(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _watch(item, "teardown")
