"""Messages of a batch handled by key (issue 16): each key's in order, different keys at once."""

from __future__ import annotations

import asyncio

from gpusched_common.messaging import Incoming, handle_by_key


def message(key: str, offset: int) -> Incoming:
    return Incoming("gpusched.nodes.commands", 0, offset, key, b"{}", {})


async def test_a_slow_key_does_not_hold_up_the_others_and_each_key_keeps_its_order():
    b_done = asyncio.Event()
    seen: list[tuple[str, int]] = []

    async def handle(m: Incoming) -> None:
        if m.key == "node-a" and m.offset == 0:
            await asyncio.wait_for(b_done.wait(), timeout=5)  # node-a's first command waits for node-b's
        seen.append((m.key or "", m.offset))
        if m.key == "node-b" and m.offset == 3:
            b_done.set()

    batch = [message("node-a", 0), message("node-b", 1), message("node-a", 2), message("node-b", 3)]
    await handle_by_key(batch, handle)
    assert seen == [("node-b", 1), ("node-b", 3), ("node-a", 0), ("node-a", 2)]


async def test_every_message_is_handled_before_the_batch_is_done():
    handled: list[int] = []

    async def handle(m: Incoming) -> None:
        await asyncio.sleep(0.001 * (m.offset % 3))
        handled.append(m.offset)

    await handle_by_key([message(f"node-{i % 7}", i) for i in range(50)], handle)
    assert sorted(handled) == list(range(50))
