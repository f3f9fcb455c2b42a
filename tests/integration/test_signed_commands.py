"""A node agent runs a command only when a trusted sender (placement, preemption) signed it for the
commands topic: an unsigned StartJob, one signed by an unknown key, one signed for another topic, and a
tampered one start nothing (counted); the signed one runs. With no trusted key and no explicit
development switch the agent does not start at all."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpusched_common import events as ev
from gpusched_common import signing
from gpusched_common.messaging import build_broker, publish
from gpusched_common.runtime import running
from gpusched_common.topics import NODES_COMMANDS, NODES_REPORTS

from services.node_agent.app import UNTRUSTED, agent_setup
from tests.integration.test_agent_broker import of, reports, start_job

_, PLACEMENT = signing.new_key()
_, STRANGER = signing.new_key()


async def send(settings, payload: ev.StartJob, headers: dict[str, str], value: bytes | None = None) -> None:
    broker = build_broker(settings, "test-sender")
    await broker.connect()
    try:
        envelope = ev.make_envelope(payload, event_id=f"cmd-{payload.job_id}", stream_id=f"node-{payload.node_id}",
                                    occurred_at=datetime.now(timezone.utc), producer="placement")
        body = value or envelope.model_dump_json().encode()
        await publish(broker, NODES_COMMANDS.name, payload.node_id, body, {"event-type": payload.TYPE, **headers})
    finally:
        await broker.stop()


def signed(payload: ev.StartJob, key=PLACEMENT, topic: str = NODES_COMMANDS.name) -> tuple[bytes, dict[str, str]]:
    envelope = ev.make_envelope(payload, event_id=f"cmd-{payload.job_id}", stream_id=f"node-{payload.node_id}",
                                occurred_at=datetime.now(timezone.utc), producer="placement")
    value = envelope.model_dump_json().encode()
    return value, signing.Signer(key).headers(topic, value)


async def test_only_a_trusted_sender_s_command_runs(settings, make_agent_settings, tmp_path):
    agent_settings = make_agent_settings(node_id="node-s", agent_accept_unsigned_commands=False,
                                         agent_command_keys=signing.trusted_entry(PLACEMENT), telemetry_interval_s=60.0)
    marker = tmp_path / "ran"
    forged = [start_job(f"forged-{i}", "node-s", "sh", "-c", f'echo {i} >> "{marker}"') for i in range(4)]
    real = start_job("real", "node-s", "true")
    setup, _ = agent_setup(agent_settings)
    before = UNTRUSTED.total()
    async with running("node-agent-s", agent_settings, setup, uses_database=False):
        await reports(settings, 1, until=lambda f: of(f, "NodeRegistered"))
        await send(settings, forged[0], {})  # a plain Kafka client, no signature
        value, headers = signed(forged[1], key=STRANGER)  # a key nobody trusts
        await send(settings, forged[1], headers, value)
        value, headers = signed(forged[2], topic=NODES_REPORTS.name)  # signed for another topic
        await send(settings, forged[2], headers, value)
        value, headers = signed(forged[3])  # a trusted signature over other bytes
        await send(settings, forged[3], headers, value.replace(b'"forged-3"', b'"forged-9"'))
        value, headers = signed(real)
        await send(settings, real, headers, value)
        found = await reports(settings, 3, until=lambda f: of(f, "JobExitReported", "real"))
    assert of(found, "JobStartReported", "real") and of(found, "JobExitReported", "real")[0]["exit_code"] == 0
    assert not marker.exists() and not [m for m in found if m["payload"].get("job_id", "").startswith("forged")]
    assert UNTRUSTED.total() == before + 4


def test_an_agent_without_trusted_keys_does_not_start(make_agent_settings):
    with pytest.raises(ValueError, match="no trusted command keys"):
        agent_setup(make_agent_settings(node_id="node-t", agent_accept_unsigned_commands=False))
    with pytest.raises(ValueError, match=r"is not \[<sender>=\]<key id>:<Ed25519 public key>"):
        agent_setup(make_agent_settings(node_id="node-t", agent_command_keys="nonsense"))
