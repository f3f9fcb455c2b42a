"""A node whose enrolment placement refused asks again, freshly signed, after a back-off that doubles: a
refusal may pass (placement read the request beyond its signature's window because it was far behind, or an
operator revoked the node's old key), and a node that gave up stayed out of the cluster until restarted."""

from __future__ import annotations


from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpusched_common import events as ev
from gpusched_common.producers import b64

from services.node_agent.agent import Agent
from services.node_agent.config import AgentConfig
from services.node_agent.identity import ENROL_RETRY_FIRST_S, ENROL_RETRY_MAX_S, load_identity
from services.node_agent.nvml import SimulatedNvml
from services.node_agent.runner import JobRunner
from tests.unit.node_agent.test_agent_shell import Recorder, command

TOKEN = f"gjt_{'0' * 16}_{b64(Ed25519PrivateKey.generate().private_bytes_raw())}"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(identity) -> ev.NodeEnrolmentRefused:
    return ev.NodeEnrolmentRefused(node_id="n1", key_id=identity.key.producer_id,
                                   reason="the request was signed at 1.0, not within 600 s of now")


def test_a_refusal_is_asked_again_after_a_back_off_that_doubles_to_a_limit(tmp_path):
    identity = load_identity(tmp_path / "n1", "n1", TOKEN, unenrolled=False)
    waits = []
    now = 0.0
    for _ in range(8):
        identity.on_answer(refused(identity), now)
        due = identity.retry_at
        assert not identity.ask_again(due - 0.1) and identity.ask_again(due)
        waits.append(due - now)
        now = due
    assert waits[:3] == [ENROL_RETRY_FIRST_S, 2 * ENROL_RETRY_FIRST_S, 4 * ENROL_RETRY_FIRST_S]
    assert waits[-1] == ENROL_RETRY_MAX_S
    identity.on_answer(ev.NodeEnrolled(node_id="n1", key_id=identity.key.producer_id), now)
    assert identity.enrolled and identity.retry_at is None and not identity.ask_again(now + 10_000)


def test_an_answer_for_another_key_or_without_a_request_schedules_nothing(tmp_path):
    identity = load_identity(tmp_path / "n1", "n1", TOKEN, unenrolled=False)
    identity.on_answer(ev.NodeEnrolmentRefused(node_id="n1", key_id="0123456789abcdef", reason="old"), 0.0)
    assert identity.retry_at is None and not identity.ask_again(10_000)


async def test_a_refused_agent_sends_its_request_and_registration_again_before_its_heartbeat(tmp_path):
    sent, clock = Recorder(), Clock()
    identity = load_identity(tmp_path / "n1", "n1", TOKEN, unenrolled=False)
    agent = Agent(AgentConfig("n1"), sent, SimulatedNvml("n1", "H100-80GB:2"), JobRunner(tmp_path / "n1"),
                  monotonic=clock, identity=identity)
    await agent.start()
    assert [m["type"] for _, m in sent.sent if m["type"] != "NodeHeartbeat"][:2] == \
        ["NodeEnrolmentRequested", "NodeRegistered"]
    await agent.on_command(command(refused(identity)))
    sent.sent.clear()
    await agent.heartbeat_once()
    await agent.flush()
    assert sent.of("NodeEnrolmentRequested") == []  # not yet due
    clock.now += ENROL_RETRY_FIRST_S
    sent.sent.clear()
    await agent.heartbeat_once()
    await agent.flush()
    kinds = [m["type"] for _, m in sent.sent]
    assert kinds[:2] == ["NodeEnrolmentRequested", "NodeRegistered"] and "NodeHeartbeat" in kinds
    request = sent.of("NodeEnrolmentRequested")[0]
    assert request["key_id"] == identity.key.producer_id
    await agent.close()


