"""The gateway keeps what it published (for the republish window) as one blob per record: the same value and
headers come back, byte for byte, and a kept submission takes less memory than its objects did."""

from __future__ import annotations

import os
import sys

from hypothesis import given
from hypothesis import strategies as st

from gpusched_common import events as ev
from services.gateway.publisher import _pack, _unpack
from services.gateway.submissions import submission_bytes

header = st.tuples(st.text(min_size=1, max_size=20), st.binary(max_size=200))


@given(st.binary(max_size=4_000), st.lists(header, max_size=6))
def test_a_kept_record_comes_back_as_it_was_published(value: bytes, headers: list[tuple[str, bytes]]) -> None:
    assert _unpack(_pack(value, headers)) == (value, headers)


def _objects_size(value: bytes, headers: list[tuple[str, bytes]]) -> int:
    return (sys.getsizeof(value) + sys.getsizeof(headers)
            + sum(sys.getsizeof(pair) + sys.getsizeof(h) for pair in headers for h in pair[1:]))  # fmt: skip


def test_a_kept_submission_takes_under_half_of_its_objects() -> None:
    spec = ev.JobSpec.model_validate({"tenant": "team-a", "gpus": 1, "command": ["sleep", "3600"], "name": "x"})
    value = submission_bytes(spec, "team-a-000123", traceparent=None, request_id=None, producer="gateway",
                             submitted_by="alice", hold=False)  # fmt: skip
    headers = [("event-type", b"JobSubmitted"), ("producer-id", b"0123456789abcdef"),
               ("signature", os.urandom(64).hex().encode()[:88]),
               ("traceparent", b"00-" + os.urandom(16).hex().encode() + b"-" + os.urandom(8).hex().encode() + b"-01")]
    assert sys.getsizeof(_pack(value, headers)) < _objects_size(value, headers) / 2
