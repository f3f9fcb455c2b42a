"""A bad message in a batch does not push the whole batch into one-by-one mode: the batch is split in
halves until the bad message is alone (it alone gets retries and the dead-letter topic); every good
message is applied once, in its order."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.batching import apply_split
from gpusched_common.messaging import Incoming


def messages(n: int) -> list[Incoming]:
    return [Incoming("t", 0, i, str(i), str(i).encode(), {}) for i in range(n)]


class Ledger:
    """A store that applies a batch all or nothing, refusing any batch that holds a bad offset."""

    def __init__(self, bad: set[int]) -> None:
        self.bad, self.applied, self.alone, self.transactions = bad, [], [], 0

    async def apply(self, part: list[Incoming]) -> None:
        self.transactions += 1
        if any(m.offset in self.bad for m in part):
            raise RuntimeError("refused")
        self.applied.extend(m.offset for m in part)

    async def single(self, message: Incoming) -> None:
        self.alone.append(message.offset)


@pytest.mark.parametrize("n, bad", [(1, set()), (1, {0}), (100, {37}), (100, {0, 99}), (64, set(range(64)))])
async def test_only_the_bad_messages_are_applied_alone(n, bad):
    ledger = Ledger(bad)
    await apply_split(messages(n), ledger.apply, ledger.single)
    assert ledger.applied == [i for i in range(n) if i not in bad]
    assert ledger.alone == sorted(bad)


async def test_one_bad_message_costs_a_few_transactions_not_one_per_message():
    ledger = Ledger({421})
    await apply_split(messages(1000), ledger.apply, ledger.single)
    assert ledger.transactions <= 2 * math.ceil(math.log2(1000)) + 1
    assert len(ledger.applied) == 999


@given(st.integers(1, 200), st.sets(st.integers(0, 199), max_size=5))
def test_every_good_message_is_applied_once_in_order(n, bad):
    bad = {b for b in bad if b < n}
    ledger = Ledger(bad)
    asyncio.run(apply_split(messages(n), ledger.apply, ledger.single))
    assert ledger.applied == [i for i in range(n) if i not in bad] and ledger.alone == sorted(bad)
