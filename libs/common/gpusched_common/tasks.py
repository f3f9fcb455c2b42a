"""Stopping background tasks so that a stop always ends.

A task may take a cancel and go on: on Python 3.11, ``asyncio.wait_for`` returns its inner result when a
cancel meets a completion in the same turn of the loop, so a loop around it runs on (the code here waits with
``asyncio.timeout`` instead, but a library's loop may still do it). Whoever stops tasks and then waits for them
with a bare ``gather`` would wait forever; ``cancel_and_wait`` cancels again until each has ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Future], *, what: str = "tasks",
                          again_after_s: float = 1.0) -> None:
    """Cancel every task and wait until all have ended, cancelling again those still running after each
    ``again_after_s`` (named in a warning: they took a cancel and went on)."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after_s)
        if pending:
            names = ", ".join(sorted(t.get_name() if isinstance(t, asyncio.Task) else repr(t) for t in pending))
            log.warning("%s: %s still running after a cancel; cancelling again", what, names)
    for task in tasks:  # what each ended with is taken, as gather(return_exceptions=True) did: never logged
        if not task.cancelled():  # as "never retrieved" when the task is collected
            task.exception()
