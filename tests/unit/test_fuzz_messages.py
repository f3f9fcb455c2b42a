"""Bad input never stalls a consumer (issue 14): whatever bytes arrive on a topic, the shared reader
(``parse_event``) and admission's (``parse_submission``) either read a message or say it can never be
handled (PoisonMessage / Unparseable: dead-lettered at once), never anything else: no RecursionError on
deep nesting, no NUL that PostgreSQL would refuse later, no unbounded size."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_common import events as ev
from gpusched_common.messaging import MAX_MESSAGE_BYTES, Incoming, PoisonMessage, parse_event, poisoned
from services.admission.core import AdmissionLimits, Unparseable, parse_submission

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
TYPES = sorted(ev.PAYLOAD_TYPES)


def incoming(value: bytes) -> Incoming:
    return Incoming("gpusched.nodes.reports", 0, 0, "n1", value, {})


def envelope(event_type: str, payload: object, version: object = 1) -> bytes:
    return json.dumps({"event_id": "e1", "type": event_type, "schema_version": version, "stream_id": "s",
                       "occurred_at": "2026-12-01T00:00:00Z", "producer": "fuzz", "payload": payload}).encode()


def reads_or_poison(value: bytes) -> None:
    try:
        parse_event(incoming(value))
    except PoisonMessage:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_are_read_or_poison(value):
    reads_or_poison(value)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(TYPES), st.dictionaries(st.text(max_size=20), JSON, max_size=8), JSON)
def test_any_payload_of_any_type_is_read_or_poison(event_type, payload, version):
    reads_or_poison(envelope(event_type, payload, version))
    reads_or_poison(envelope(event_type, payload))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TYPES), st.text(min_size=1, max_size=5))
def test_a_nul_anywhere_is_poison(event_type, text):
    value = envelope(event_type, {"node_id": f"{text}\x00", "job_id": "j"})
    assert isinstance(poisoned(incoming(value)), PoisonMessage)


def test_deep_nesting_oversize_and_unknown_types_are_poison_at_once():
    deep = b'{"payload":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert "unreadable" in str(poisoned(incoming(deep)))
    assert "over" in str(poisoned(incoming(b" " * (MAX_MESSAGE_BYTES + 1))))
    assert "unknown event type" in str(poisoned(incoming(envelope("NoSuchType", {}))))
    assert "schema version 7" in str(poisoned(incoming(envelope("NodeHeartbeat", {"node_id": "n", "running_jobs": []}, 7))))
    good = envelope("NodeHeartbeat", {"node_id": "n", "running_jobs": []})
    message = incoming(good)
    assert poisoned(message) is None and parse_event(message) is message.parsed  # parsed once, kept


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=1000),
                 st.builds(lambda p: envelope("JobSubmitted", p), st.dictionaries(st.text(max_size=10), JSON))))
def test_a_submission_is_read_or_unparseable(value):
    try:
        parse_submission(value, AdmissionLimits())
    except Unparseable:
        pass


def test_a_deep_or_nul_submission_is_unparseable():
    for value in (b"[" * 100_000 + b"]" * 100_000, envelope("JobSubmitted", {"job_id": "j\x00"})):
        try:
            parse_submission(value, AdmissionLimits())
        except Unparseable:
            continue
        raise AssertionError(value[:40])
