"""Which node commands an agent runs (``command_refusal``), by the senders table: a trusted, named sender
only for the types it may send, only within the window of its signature, never a type that is no node
command; an unnamed trusted key (an older keys file) for any command."""

from __future__ import annotations

import uuid

import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from gpusched_common import events as ev
from gpusched_common import senders, signing
from gpusched_common.messaging import Incoming
from gpusched_common.topics import NODES_COMMANDS

from services.node_agent.app import UNTRUSTED, command_refusal, own_commands_only, signed_only

_, PLACEMENT = signing.new_key()
_, PREEMPTION = signing.new_key()
TRUSTED = signing.TrustedKeys.parse([signing.trusted_entry(PLACEMENT, "placement"),
                                     signing.trusted_entry(PREEMPTION, "preemption")])
NOW = time.time()

START = ev.StartJob(job_id="j1", node_id="n1", tenant="t", command=["true"], gpu_indices=[0], gpu_uuids=["u0"])
PREEMPT = ev.PreemptJob(job_id="j1", node_id="n1", grace_s=5.0, deadline_at=datetime.now(timezone.utc),
                       reason="test")
ENROLLED = ev.NodeEnrolled(node_id="n1", key_id="0" * 16)
HEARTBEAT = ev.NodeHeartbeat(node_id="n1", running_jobs=[])


def message(payload: ev.Payload, key, at: float = NOW) -> Incoming:
    value = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id="node-n1", occurred_at=datetime.now(timezone.utc),
                             producer="x").model_dump_json().encode()
    return Incoming(NODES_COMMANDS.name, 0, 0, "n1", value, signing.Signer(key).headers(NODES_COMMANDS.name, value, at))


@pytest.mark.parametrize("payload, key, at, refused", [
    (START, PLACEMENT, NOW, None),
    (ENROLLED, PLACEMENT, NOW, None),
    (PREEMPT, PREEMPTION, NOW, None),
    (PREEMPT, PLACEMENT, NOW, None),  # a drain: placement preempts too
    (START, PREEMPTION, NOW, "preemption may not send StartJob"),
    (ENROLLED, PREEMPTION, NOW, "preemption may not send NodeEnrolled"),
    (HEARTBEAT, PLACEMENT, NOW, "NodeHeartbeat is no node command"),
    (START, PLACEMENT, NOW - senders.COMMAND_WINDOW_S - 1, "outside its 900 s window"),
    (START, PLACEMENT, NOW + senders.MAX_SKEW_S + 60, "outside its 900 s window"),
])
def test_a_command_is_run_only_from_its_sender_within_its_window(payload, key, at, refused):
    found = command_refusal(TRUSTED, message(payload, key, at), NOW)
    assert (found is None) if refused is None else (refused in (found or ""))


def test_an_unnamed_trusted_key_may_send_any_node_command():
    unnamed = signing.TrustedKeys.parse([signing.trusted_entry(PREEMPTION)])
    assert command_refusal(unnamed, message(START, PREEMPTION), NOW) is None


def test_a_named_entry_must_be_a_name():
    with pytest.raises(ValueError, match="sender"):
        signing.TrustedKeys.parse(["bad name=" + signing.trusted_entry(PLACEMENT)])


async def test_another_nodes_command_is_dropped_before_its_signature_is_checked():
    """A partition carries other nodes' commands too (issue 16): only this process's own are verified."""
    ran: list[str | None] = []

    async def run(message: Incoming) -> None:
        ran.append(message.key)

    def signed_now(payload: ev.Payload, key) -> Incoming:  # noqa: ANN001 - signed_only reads the real clock
        return message(payload, key, at=time.time())

    _, stranger = signing.new_key()
    handle = own_commands_only(["n1", "n3"], signed_only(TRUSTED, run))
    refused_before = UNTRUSTED.total()
    for key in ("n2", "n4", None):  # others' commands, forged or not: neither verified nor run
        for signer in (PLACEMENT, stranger):
            await handle(replace(signed_now(START, signer), key=key))
    assert (ran, UNTRUSTED.total()) == ([], refused_before)
    await handle(signed_now(START, stranger))  # its own: verified, and refused
    assert (ran, UNTRUSTED.total()) == ([], refused_before + 1)
    await handle(signed_now(START, PLACEMENT))
    await handle(replace(signed_now(START, PLACEMENT), key="n3"))
    assert ran == ["n1", "n3"]
