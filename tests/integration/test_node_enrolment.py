"""Node identity on the real broker and PostgreSQL (issue 14): a node enrols its own key with an operator's
join token and placement believes its reports; a plain Kafka client's heartbeat, one signed by another
node's key, one by a stranger's key and one whose signature does not hold are refused and counted, and
change nothing; a node whose key an operator revoked is refused; a second key for an enrolled node, an
expired or revoked token, and a request no token vouches for enrol nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from gpusched_common import events as ev
from gpusched_cli.main import main
from gpusched_common import node_keys, signing
from gpusched_common.messaging import build_broker, publish
from gpusched_common.runtime import running
from gpusched_common.topics import NODES_COMMANDS, NODES_REPORTS

from services.node_agent.app import agent_setup, build_agent
from services.node_agent.identity import ENROLLED_FILE, KEY_FILE
from services.placement.app import setup as placement_setup
from services.placement.settings import PlacementSettings
from tests.integration.kafka_helpers import read_topic

NOW = datetime.now(timezone.utc)


async def new_token(database_url: str, ttl: timedelta | None = timedelta(hours=1)) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        text, _ = await node_keys.create_token(conn, description="test", ttl=ttl, created_by="test",
                                               now=datetime.now(timezone.utc))
        return text
    finally:
        await conn.close()


async def until(database_url: str, query: str, *args, timeout_s: float = 20.0):
    """Poll the store until ``query`` returns a row (a positive signal), and return its first value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    conn = await asyncpg.connect(database_url)
    try:
        while True:
            value = await conn.fetchval(query, *args)
            if value is not None:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"nothing for {query} {args} within {timeout_s}s")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def send_report(settings, payload: ev.Payload, key=None, *, tamper: bool = False,
                      signed_for: str = NODES_REPORTS.name) -> None:
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{payload.node_id}",
                                occurred_at=datetime.now(timezone.utc), producer="node-agent")
    value = envelope.model_dump_json().encode()
    headers = {"event-type": payload.TYPE}
    if key is not None:
        headers.update(signing.Signer(key).headers(signed_for, value))
    if tamper:
        value = value.replace(b'"lease_epoch":1', b'"lease_epoch":7')
    broker = build_broker(settings, "test-forger")
    await broker.connect()
    try:
        await publish(broker, NODES_REPORTS.name, payload.node_id, value, headers)
    finally:
        await broker.stop()


def heartbeat(node: str, epoch: int = 1, ttl: float = 30.0) -> ev.NodeHeartbeat:
    return ev.NodeHeartbeat(node_id=node, running_jobs=[], lease_epoch=epoch, lease_ttl_s=ttl, fence_grace_s=10)


async def refused(database_url: str, reason: str, at_least: int = 1) -> int:
    """Once placement counted ``at_least`` refusals for ``reason``: how many it counted."""
    return await until(database_url, "SELECT n FROM (SELECT sum(refused) AS n FROM refused_messages WHERE"
                                     " receiver = 'placement' AND reason = $1) s WHERE n >= $2", reason, at_least)


async def test_a_node_enrols_its_key_and_only_what_it_signed_is_believed(settings, make_agent_settings, tmp_path):
    service_key = tmp_path / "placement.key"
    placement_key = signing.ensure_key_file(service_key)
    token = await new_token(settings.database_url)
    agent_settings = make_agent_settings(node_id="node-e", agent_unenrolled=False, agent_join_token=token,
                                         agent_accept_unsigned_commands=False, heartbeat_interval_s=0.5,
                                         agent_command_keys=signing.trusted_entry(placement_key),
                                         telemetry_interval_s=60.0)
    placement_settings = PlacementSettings.of(settings, service_key_file=service_key)
    setup, _ = agent_setup(agent_settings)
    node_dir = agent_settings.agent_work_dir / "node-e"
    async with running("placement", placement_settings, placement_setup), \
            running("node-agent-e", agent_settings, setup, uses_database=False):
        key_id = await until(settings.database_url, "SELECT key_id FROM node_keys WHERE node_id = 'node-e'")
        await until(settings.database_url, "SELECT 1 FROM nodes WHERE node_id = 'node-e' AND status = 'Ready'")
        for _ in range(100):  # the agent heard placement's NodeEnrolled (signed by placement) and kept it
            if (node_dir / ENROLLED_FILE).exists():
                break
            await asyncio.sleep(0.1)
        assert (node_dir / ENROLLED_FILE).read_text().strip() == key_id
        assert oct((node_dir / KEY_FILE).stat().st_mode & 0o777) == "0o600"
        node_key = signing.load_key(node_dir / KEY_FILE)

        # forgeries: a plain client, a stranger's key, a tampered signature, node-e speaking for node-x
        _, stranger = signing.new_key()
        await send_report(settings, ev.NodeRegistered(
            node_id="node-x", hostname="x", cpu_milli=1000, memory_mib=1024, nvml_backend="simulated", lease_epoch=1,
            gpus=[ev.GpuInventory(index=0, uuid="x-0", model="H100-80GB", memory_mib=81559)]))
        await send_report(settings, heartbeat("node-e", epoch=99, ttl=1e6), stranger)
        await send_report(settings, heartbeat("node-e"), node_key, tamper=True)
        await send_report(settings, heartbeat("node-x"), node_key)
        await send_report(settings, heartbeat("node-e"), node_key, signed_for=NODES_COMMANDS.name)
        assert await refused(settings.database_url, node_keys.UNSIGNED) == 1
        assert await refused(settings.database_url, node_keys.UNKNOWN) == 1
        assert await refused(settings.database_url, node_keys.OTHER_NODE) == 1
        assert await refused(settings.database_url, node_keys.BAD_SIGNATURE, 2) == 2  # tampered; other topic's
        conn = await asyncpg.connect(settings.database_url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM nodes WHERE node_id = 'node-x'") == 0
            assert await conn.fetchval("SELECT lease_epoch FROM nodes WHERE node_id = 'node-e'") == 1
            sender = await conn.fetchval("SELECT sender FROM refused_messages WHERE reason = $1",
                                         node_keys.OTHER_NODE)
            assert sender == "node-e"  # who signed it: known, and counted against it

            # another key for node-e, vouched for by the token: refused (and told), its key not enrolled
            _, other = signing.new_key()
            request = node_keys.enrolment_request(node_keys.parse_token(token), "node-e", other.producer_id,
                                                  other.public_key_text())
            await send_report(settings, request, other)
            await refused(settings.database_url, "enrolment")
            # placement's answers so far: NodeEnrolled, ReconcileJobs, then this refusal
            answers = await read_topic(settings.kafka_bootstrap, NODES_COMMANDS.name, expect=3, timeout_s=20)
            refusal = [a for a in (ev.Envelope.model_validate_json(r.value) for r in answers)
                       if a.type == ev.NodeEnrolmentRefused.TYPE]
            assert refusal and "enrolled with another key" in refusal[0].payload["reason"]
            assert await conn.fetchval("SELECT count(*) FROM node_keys WHERE node_id = 'node-e'") == 1

            # an operator revokes node-e's key: from then on its reports are refused (within the cache's TTL)
            async with conn.transaction():
                assert await node_keys.revoke_node(conn, "node-e", "test", datetime.now(timezone.utc)) == [key_id]
            assert await refused(settings.database_url, node_keys.REVOKED) >= 1
        finally:
            await conn.close()


def request_for(token_text: str, key, node: str = "node-n") -> ev.NodeEnrolmentRequested:
    return node_keys.enrolment_request(node_keys.parse_token(token_text), node, key.producer_id,
                                       key.public_key_text())


def envelope_and_headers(payload: ev.Payload, key, topic: str = NODES_REPORTS.name):
    value = ev.make_envelope(payload, event_id="e1", stream_id="node-n", occurred_at=NOW,
                             producer="node-agent").model_dump_json().encode()
    return value, signing.Signer(key).headers(topic, value)


async def enrol(database_url: str, request, value, headers):
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            return await node_keys.enrol(conn, request, headers, NODES_REPORTS.name, value, datetime.now(timezone.utc))
    finally:
        await conn.close()


@pytest.mark.parametrize("case", ["expired", "revoked", "no token", "other token's signature", "not its key"])
async def test_an_enrolment_no_valid_token_vouches_for_enrols_nothing(database_url, case):
    token = await new_token(database_url, ttl=timedelta(seconds=1) if case == "expired" else timedelta(hours=1))
    _, key = signing.new_key()
    request = request_for(token, key)
    value, headers = envelope_and_headers(request, key)
    if case == "expired":
        await asyncio.sleep(1.1)
    elif case == "revoked":
        conn = await asyncpg.connect(database_url)
        await node_keys.revoke_token(conn, node_keys.parse_token(token).token_id, datetime.now(timezone.utc))
        await conn.close()
    elif case == "no token":
        request = request.model_copy(update={"token_id": "0" * 16})
        value, headers = envelope_and_headers(request, key)
    elif case == "other token's signature":
        other = await new_token(database_url)
        forged = request_for(other, key)
        request = request.model_copy(update={"token_signature": forged.token_signature})
        value, headers = envelope_and_headers(request, key)
    elif case == "not its key":  # signed by a key other than the one it asks to enrol
        _, stranger = signing.new_key()
        value, headers = envelope_and_headers(request, stranger)
    decision = await enrol(database_url, request, value, headers)
    assert isinstance(decision, node_keys.RefuseEnrolment)
    assert decision.answer is (case in ("expired", "revoked"))
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM node_keys") == 0
    finally:
        await conn.close()


async def test_a_resent_enrolment_is_idempotent_and_a_revoked_node_enrols_again(database_url):
    token = await new_token(database_url)
    _, key = signing.new_key()
    request = request_for(token, key)
    value, headers = envelope_and_headers(request, key)
    first = await enrol(database_url, request, value, headers)
    again = await enrol(database_url, request, value, headers)
    assert isinstance(first, node_keys.Enrol) and first.new
    assert isinstance(again, node_keys.Enrol) and not again.new
    _, second_key = signing.new_key()
    second = request_for(token, second_key)
    value2, headers2 = envelope_and_headers(second, second_key)
    assert isinstance(await enrol(database_url, second, value2, headers2), node_keys.RefuseEnrolment)
    conn = await asyncpg.connect(database_url)
    try:
        await node_keys.revoke_node(conn, "node-n", "test", datetime.now(timezone.utc))
    finally:
        await conn.close()
    assert isinstance(await enrol(database_url, second, value2, headers2), node_keys.Enrol)


def test_an_agent_that_is_not_enrolled_and_has_no_token_does_not_start(make_agent_settings):
    with pytest.raises(ValueError, match="not enrolled and has no join token"):
        build_agent(make_agent_settings(node_id="node-z", agent_unenrolled=False), "node-z", None)
    with pytest.raises(ValueError, match="is not a gjt_"):
        build_agent(make_agent_settings(node_id="node-z", agent_join_token="gjt_nonsense"), "node-z", None)


def test_operators_create_list_and_revoke_join_tokens_and_node_keys(database_url, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", database_url)
    assert main(["join-token", "create", "--ttl", "2h", "--description", "rack 12", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["token"].startswith(f"gjt_{created['token_id']}_") and created["expires_at"]
    assert main(["join-token", "create", "--ttl", "never", "--file", str(tmp_path / "token")]) == 0
    assert "written to" in capsys.readouterr().out
    assert oct((tmp_path / "token").stat().st_mode & 0o777) == "0o600"
    assert node_keys.parse_token((tmp_path / "token").read_text()) is not None
    assert main(["join-token", "list"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["ID", "DESCRIPTION", "CREATED", "BY", "EXPIRES", "REVOKED", "NODES"]
    assert "rack 12" in table and "never" in table and created["token"] not in table

    _, key = signing.new_key()
    request = request_for(created["token"], key, node="node-c")
    value, headers = envelope_and_headers(request, key)
    assert isinstance(asyncio.run(enrol(database_url, request, value, headers)), node_keys.Enrol)
    assert main(["node-keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(k["node_id"], k["key_id"], k["revoked_at"]) for k in listed] == [("node-c", key.producer_id, None)]
    assert main(["node-keys", "revoke", "node-c"]) == 0
    assert "its reports are refused" in capsys.readouterr().out
    assert main(["node-keys", "revoke", "node-c"]) == 1
    assert "has no live key" in capsys.readouterr().err
    assert main(["join-token", "revoke", created["token_id"]]) == 0
    assert main(["join-token", "revoke", created["token_id"]]) == 1
    capsys.readouterr()
    assert main(["node-keys", "refused", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["join-token", "create", "--ttl", "soon"], "duration must be"),
    (["join-token", "create", "--description", "x" * 201], "at most 200 characters"),
    (["join-token", "revoke", "not-an-id"], "invalid token id"),
    (["node-keys", "revoke", "no such/node"], "invalid node id"),
])
def test_bad_enrolment_cli_input_exits_2_with_a_message(database_url, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", database_url)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


async def test_an_enrolled_node_resending_its_request_after_the_token_expired_is_still_enrolled(database_url):
    token = await new_token(database_url, ttl=timedelta(seconds=1))
    _, key = signing.new_key()
    request = request_for(token, key)
    value, headers = envelope_and_headers(request, key)
    assert isinstance(await enrol(database_url, request, value, headers), node_keys.Enrol)
    await asyncio.sleep(1.1)  # the token expired; the node missed placement's answer and asks again
    again = await enrol(database_url, request, value, headers)
    assert isinstance(again, node_keys.Enrol) and not again.new
    conn = await asyncpg.connect(database_url)
    try:
        await node_keys.revoke_node(conn, "node-n", "test", datetime.now(timezone.utc))
    finally:
        await conn.close()
    refused = await enrol(database_url, request, value, headers)  # a revoked key never comes back
    assert isinstance(refused, node_keys.RefuseEnrolment)
