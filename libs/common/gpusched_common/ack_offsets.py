"""Noticing a broker that lost its data, from its own acknowledgements (issue 15).

A broker acknowledges each record with its offset in the partition, and offsets only grow while the log
lives (every record takes a new one): an acknowledgement at or below the highest one seen before on that
partition means the log was lost (Tansu restarted: it keeps nothing; a Kafka log wiped, its topic
recreated). One loss is reported once: the other partitions' counts start again with it. The outbox relay
and the gateway each keep one of these and publish again what they published
recently when it says so.
"""

from __future__ import annotations

from collections.abc import Iterable


class AckOffsets:
    def __init__(self, high: dict[str, int] | None = None) -> None:
        self.high: dict[str, int] = dict(high or {})  # "topic:partition" -> the highest offset acknowledged

    def note(self, acks: Iterable[object]) -> list[str]:
        """Take these acknowledgements (record metadata: topic, partition, offset); the partitions whose log
        was lost since, described (empty: none)."""
        regressed = []
        for ack in acks:
            topic, partition, offset = getattr(ack, "topic", None), getattr(ack, "partition", None), \
                getattr(ack, "offset", None)
            if not isinstance(offset, int) or offset < 0 or topic is None or partition is None:
                continue
            where = f"{topic}:{partition}"
            before = self.high.get(where, -1)
            if offset <= before:
                regressed.append(f"{where} (offset {before} before, {offset} now)")
                # the broker lost its data (every partition, as a rule): the one republish that follows covers
                # them all, so the other partitions start their count again with it rather than each calling
                # for a republish of its own at its first acknowledgement in the new log
                self.high = {where: offset}
            else:
                self.high[where] = max(offset, before)
        return regressed
