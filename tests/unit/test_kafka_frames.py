"""What the Tansu front reads from Kafka frames (`infra/kafka_frames.py`), checked against the frames aiokafka
itself encodes, for every version it can send."""

from __future__ import annotations

import struct

import pytest
from aiokafka.protocol import fetch as fetch_protocol
from aiokafka.protocol import produce as produce_protocol
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.infra import kafka_frames as kf

TOPICS = [("jobs.events", [(0, 17, 4096), (5, 0, 4096)]), ("nodes.commands", [(311, 9, 1024)])]
WANT = (("jobs.events", 0), ("jobs.events", 5), ("nodes.commands", 311))


def _frame(struct_obj, correlation_id: int = 7, client_id: str = "placement-1") -> bytes:
    return struct_obj.build_request_header(correlation_id, client_id).encode() + struct_obj.encode()


def _fetch_frame(version: int, max_wait_ms: int = 500, min_bytes: int = 1) -> bytes:
    cls = getattr(fetch_protocol, f"FetchRequest_v{version}")
    request = fetch_protocol.FetchRequest(max_wait_ms, min_bytes, 1 << 20, 1 if version >= 4 else 0, TOPICS,
                                          rack_id="r1")
    return _frame(request.build(cls))


@pytest.mark.parametrize("version", range(0, kf.MAX_FETCH_VERSION + 1))
def test_a_fetch_request_of_every_version_is_read(version):
    frame = _fetch_frame(version, max_wait_ms=1234, min_bytes=3)
    head = kf.header(frame)
    assert (head.api_key, head.api_version, head.correlation_id) == (kf.FETCH, version, 7)
    fetch = kf.fetch_request(frame, head)
    assert fetch is not None
    assert (fetch.version, fetch.max_wait_ms, fetch.min_bytes, fetch.partitions) == (version, 1234, 3, WANT)
    assert kf.produce_request(frame, head) is None


@pytest.mark.parametrize("version", range(0, kf.MAX_FETCH_VERSION + 1))
def test_only_the_wait_of_a_fetch_changes(version):
    frame = _fetch_frame(version, max_wait_ms=500)
    fetch = kf.fetch_request(frame, kf.header(frame))
    changed = kf.with_wait(frame, fetch, 1)
    assert changed == _fetch_frame(version, max_wait_ms=1)
    again = kf.fetch_request(changed, kf.header(changed))
    assert (again.max_wait_ms, again.partitions) == (1, WANT)


@pytest.mark.parametrize("version", range(0, kf.MAX_PRODUCE_VERSION + 1))
def test_a_produce_request_of_every_version_is_read(version):
    cls = getattr(produce_protocol, f"ProduceRequest_v{version}")
    data = [("jobs.events", [(2, b"records-a"), (0, b"")]), ("nodes.reports", [(900, b"r" * 300)])]
    args = ([None] if version >= 3 else []) + [-1, 30_000, data]
    frame = _frame(cls(*args))
    head = kf.header(frame)
    assert kf.fetch_request(frame, head) is None
    assert kf.produce_request(frame, head) == (-1, (("jobs.events", 2), ("jobs.events", 0), ("nodes.reports", 900)))


def _fetch_answer(version: int, records: bytes = b"", error: int = 0, top_error: int = 0) -> bytes:
    """A fetch response frame as a broker sends it (without the size), built with aiokafka's own types."""
    cls = getattr(fetch_protocol, f"FetchResponse_v{version}")
    partition = [0, error, 42]
    if version >= 4:
        partition += [42] + ([0] if version >= 5 else []) + [[(1, 2)] if version >= 5 else []]
    if version >= 11:
        partition.append(-1)
    partition.append(records)
    topics = [("jobs.events", [tuple(partition), tuple([5] + partition[1:-1] + [b""])])]
    head = ([0] if version >= 1 else []) + ([top_error, 0] if version >= 7 else [])
    return struct.pack(">i", 99) + cls(*head, topics).encode()


@pytest.mark.parametrize("version", range(0, kf.MAX_FETCH_VERSION + 1))
def test_an_answer_with_no_record_is_empty_and_any_record_or_error_is_not(version):
    assert kf.fetch_answer_empty(_fetch_answer(version), version)
    assert not kf.fetch_answer_empty(_fetch_answer(version, records=b"\0" * 70), version)
    assert not kf.fetch_answer_empty(_fetch_answer(version, error=6), version)  # not the leader: pass it on now
    if version >= 7:
        assert not kf.fetch_answer_empty(_fetch_answer(version, top_error=1), version)


def test_tansus_answer_to_a_fetch_it_did_not_wait_for_is_empty():
    # what Tansu sends for a v11 fetch with max_wait_ms 0: no topic at all (hence the front asks with 1 ms)
    assert kf.fetch_answer_empty(struct.pack(">iihii", 5, 0, 0, 0, 0), 11)


def test_an_answer_with_bytes_left_over_is_not_taken_for_empty():
    assert not kf.fetch_answer_empty(_fetch_answer(4) + b"\0", 4)


def test_requests_the_front_does_not_read_are_none():
    frame = struct.pack(">hhih", 18, 3, 1, 0)  # ApiVersions
    assert kf.fetch_request(frame, kf.header(frame)) is None
    assert kf.produce_request(frame, kf.header(frame)) is None
    flexible = struct.pack(">hhih", kf.FETCH, 12, 1, 0) + b"\0" * 40
    assert kf.fetch_request(flexible, kf.header(flexible)) is None


@given(st.integers(0, kf.MAX_FETCH_VERSION), st.data())
def test_a_cut_short_frame_is_malformed_never_another_error(version, data):
    frame = _fetch_frame(version)
    cut = frame[:data.draw(st.integers(0, len(frame) - 1))]
    try:
        head = kf.header(cut)
        kf.fetch_request(cut, head)
    except kf.Malformed:
        pass
    answer = _fetch_answer(version, records=b"\1" * 30)
    assert not kf.fetch_answer_empty(answer[:data.draw(st.integers(0, len(answer) - 1))], version)


@given(st.binary(max_size=200))
def test_any_bytes_are_read_or_refused_as_malformed(blob):
    try:
        head = kf.header(blob)
        kf.fetch_request(blob, head)
        kf.produce_request(blob, head)
    except kf.Malformed:
        pass
    kf.fetch_answer_empty(blob, 11)
