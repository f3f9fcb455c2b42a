"""Whether a node's message is believed (``node_keys.judge``, pure), row by row: signed by a live key of
the very node it names, for this topic, within its window; and the senders table is complete."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from gpusched_common import events as ev
from gpusched_common import node_keys, senders, signing
from gpusched_common.topics import ALL_TOPICS, NODES_COMMANDS, NODES_REPORTS, NODES_TELEMETRY

NOW = time.time()
_, KEY = signing.new_key()
RECORD = node_keys.NodeKey(KEY.producer_id, "n1", KEY.public_key(), "0" * 16, datetime.now(timezone.utc), None)
KNOWN = node_keys.NodeKeys()
KNOWN.put(RECORD)
_, OTHER = signing.new_key()
VALUE = b'{"a message": 1}'


def headers(key=KEY, topic=NODES_REPORTS.name, at=NOW) -> dict[str, str]:
    return signing.Signer(key).headers(topic, VALUE, at)


@pytest.mark.parametrize("case, sent, node, key, max_age, refused", [
    ("believed", headers(), "n1", KNOWN.get(KEY.producer_id), None, None),
    ("unsigned", {}, "n1", None, None, node_keys.UNSIGNED),
    ("unknown key", headers(OTHER), "n1", None, None, node_keys.UNKNOWN),
    ("revoked", headers(), "n1", (node_keys.NodeKey(**{**RECORD.__dict__, "revoked_at": datetime.now(timezone.utc)}),
                                   KNOWN.get(KEY.producer_id)[1]), None, node_keys.REVOKED),
    ("another topic's signature", headers(topic=NODES_COMMANDS.name), "n1", KNOWN.get(KEY.producer_id), None,
     node_keys.BAD_SIGNATURE),
    ("another node named", headers(), "n2", KNOWN.get(KEY.producer_id), None, node_keys.OTHER_NODE),
    ("replayed after its window", headers(at=NOW - 901), "n1", KNOWN.get(KEY.producer_id), 900.0, node_keys.STALE),
    ("late report without a window", headers(at=NOW - 86400), "n1", KNOWN.get(KEY.producer_id), None, None),
    ("from the future", headers(at=NOW + senders.MAX_SKEW_S + 5), "n1", KNOWN.get(KEY.producer_id), None,
     node_keys.STALE),
    ("no time", {**headers(), signing.SIGNED_AT_HEADER: "nan"}, "n1", KNOWN.get(KEY.producer_id), None,
     node_keys.BAD_SIGNATURE),
])
def test_a_node_message_is_believed_only_from_its_own_node_within_its_window(case, sent, node, key, max_age, refused):
    found = node_keys.judge(NODES_REPORTS.name, VALUE, sent, node, key, now=NOW, max_age_s=max_age,
                            max_skew_s=senders.MAX_SKEW_S)
    assert (found.code if found else None) == refused, (case, found)


def test_every_message_type_has_a_rule_and_every_rule_a_known_topic():
    ruled = {t for rule in senders.RULES for t in rule.types}
    assert set(ev.PAYLOAD_TYPES) - ruled == set()
    assert {rule.topic for rule in senders.RULES} <= {t.name for t in ALL_TOPICS}
    assert senders.rule_for(NODES_TELEMETRY.name, "GpuTelemetry").proof == senders.NODE_SIGNATURE
    assert senders.rule_for(NODES_REPORTS.name, "StartJob") is None  # a command is never a report
    assert senders.may_send(NODES_COMMANDS.name, "PreemptJob", "preemption")
    assert not senders.may_send(NODES_COMMANDS.name, "StartJob", "preemption")
    assert senders.senders_of(NODES_COMMANDS.name) == ("placement", "preemption")


def test_a_join_token_signs_which_node_with_which_key():
    text, token = "gjt_" + "0" * 16 + "_" + "A" * 43, None
    token = node_keys.parse_token(text)
    assert token is not None and node_keys.parse_token("gjt_short") is None and node_keys.parse_token(text + "x") is None
    request = node_keys.enrolment_request(token, "n1", KEY.producer_id, KEY.public_key_text())
    other = node_keys.enrolment_request(token, "n2", KEY.producer_id, KEY.public_key_text())
    assert request.token_signature != other.token_signature
