"""Who may send what on which topic, and how the receiver knows (issue 14): the one table every consumer
checks a message against before it believes it (``rule_for``). A message of a type its topic does not
carry, or from a sender its rule does not name, is refused and counted (``RefusalCounts``), never acted on.

How a receiver knows who sent a message (``proof``):

- ``producer-signature``: the Ed25519 signature of a credentialed producer whose key the store keeps
  (``gpusched_common.producers``), bound to the tenants it may submit for; ``producer-attested``: the
  same, by a producer that may attest (the gateway, for the operator or user it authenticated);
- ``operator-key``: the tenant keys file's operator key (``gpusched_common.credentials``);
- ``event-store``: the message is only a wake-up; the receiver acts on the event as the event store
  holds it (``gpusched_common.jobs.stored_payload``), which only the service that decided it wrote;
  ``reclaim-store``: likewise, the reclaim as quota recorded it (``stores.quota.recorded_reclaim``);
- ``service-signature``: the sending service's Ed25519 key (``gpusched_common.signing``; agents hold the
  public keys of placement and preemption);
- ``node-signature``: the enrolled key of the very node the payload names (``gpusched_common.node_keys``);
  ``join-token``: a node's enrolment, signed by its new key and vouched for by an operator's join token.

``max_age_s``: the validity window of ``gpusched-signed-at`` for signed messages whose replay could do harm
(a heartbeat would keep a dead node's lease alive); a report that must count however late it is read
(an exit, a start) has none: it is fenced by its attempt and deduplicated by its event id instead.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import asyncpg

from gpusched_common import events as ev
from gpusched_common import signing
from gpusched_common.topics import (
    CLUSTER_SCALING,
    JOBS_CONTROL,
    JOBS_EVENTS,
    JOBS_SUBMITTED,
    NODES_COMMANDS,
    NODES_REPORTS,
    NODES_TELEMETRY,
    QUOTA_RECLAIMS,
    TENANCY_UPDATES,
)

log = logging.getLogger(__name__)

PRODUCER_SIGNATURE = "producer-signature"
PRODUCER_ATTESTED = "producer-attested"
OPERATOR_KEY = "operator-key"
EVENT_STORE = "event-store"
RECLAIM_STORE = "reclaim-store"
SERVICE_SIGNATURE = "service-signature"
NODE_SIGNATURE = "node-signature"
JOIN_TOKEN = "join-token"

NODE = "node"  # the node the payload names
COMMAND_WINDOW_S = 900.0  # node commands and heartbeats: read within 15 minutes of being signed, or never
TELEMETRY_WINDOW_S = 300.0
ENROLMENT_WINDOW_S = 600.0
MAX_SKEW_S = 300.0  # how far ahead of the receiver's clock a sender's may be


@dataclass(frozen=True)
class Rule:
    topic: str
    types: tuple[str, ...]
    senders: tuple[str, ...]
    proof: str
    receivers: tuple[str, ...]
    max_age_s: float | None = None


def _types(*models: type[ev.Payload]) -> tuple[str, ...]:
    return tuple(m.TYPE for m in models)


_JOB_EVENTS = _types(
    ev.JobAdmitted, ev.JobRejected, ev.QuotaDeferred, ev.QuotaReserved, ev.JobPlaced, ev.GangMemberExited,
    ev.PlacementDeferred, ev.JobStarted, ev.JobSucceeded, ev.JobFailed, ev.JobCancelled, ev.JobCancelRequested,
    ev.JobHeld, ev.JobReleased, ev.JobRequeued, ev.QuotaReleased, ev.PreemptionRequested, ev.VictimsSelected,
    ev.JobCheckpointed, ev.JobPreempted, ev.NodeCordoned, ev.NodeUncordoned)
_NODE_REPORTS = _types(ev.NodeRegistered, ev.NodeHeartbeat, ev.JobStartReported, ev.JobExitReported,
                       ev.JobCheckpointReported, ev.GpuHealthChanged)

RULES: tuple[Rule, ...] = (
    Rule(JOBS_SUBMITTED.name, _types(ev.JobSubmitted), ("gateway", "credentialed producers"), PRODUCER_SIGNATURE,
         ("admission",)),
    Rule(JOBS_CONTROL.name, _types(ev.CancelJob, ev.HoldJob, ev.ReleaseJob), ("gateway",), PRODUCER_ATTESTED,
         ("admission",)),
    Rule(JOBS_CONTROL.name, _types(ev.CordonNode), ("gateway",), PRODUCER_ATTESTED, ("placement",)),
    Rule(JOBS_EVENTS.name, _JOB_EVENTS, ("admission", "quota", "placement", "preemption"), EVENT_STORE,
         ("quota", "placement", "preemption")),
    Rule(NODES_COMMANDS.name, _types(ev.StartJob, ev.StopJob, ev.ReconcileJobs, ev.NodeEnrolled,
                                     ev.NodeEnrolmentRefused, ev.NodeLost), ("placement",), SERVICE_SIGNATURE,
         ("node-agent",),
         COMMAND_WINDOW_S),
    Rule(NODES_COMMANDS.name, _types(ev.PreemptJob), ("placement", "preemption"), SERVICE_SIGNATURE,
         ("node-agent",), COMMAND_WINDOW_S),
    Rule(NODES_REPORTS.name, _types(ev.NodeEnrolmentRequested), (NODE,), JOIN_TOKEN, ("placement",),
         ENROLMENT_WINDOW_S),
    Rule(NODES_REPORTS.name, _types(ev.NodeHeartbeat), (NODE,), NODE_SIGNATURE, ("placement",), COMMAND_WINDOW_S),
    Rule(NODES_REPORTS.name, tuple(t for t in _NODE_REPORTS if t != ev.NodeHeartbeat.TYPE), (NODE,),
         NODE_SIGNATURE, ("placement",)),
    Rule(NODES_TELEMETRY.name, _types(ev.GpuTelemetry), (NODE,), NODE_SIGNATURE, ("metrics",), TELEMETRY_WINDOW_S),
    Rule(QUOTA_RECLAIMS.name, _types(ev.ReclaimRequested), ("quota",), RECLAIM_STORE, ("preemption",)),
    Rule(TENANCY_UPDATES.name, _types(ev.TenancyUpdated), ("operator",), OPERATOR_KEY, ("quota",)),
    Rule(CLUSTER_SCALING.name, _types(ev.ScaleOutRequested, ev.ScaleInRequested), ("metrics",), SERVICE_SIGNATURE,
         ("cluster autoscalers",)),
)

_BY_TOPIC_TYPE: dict[tuple[str, str], Rule] = {}
for _rule in RULES:
    for _type in _rule.types:
        assert (_rule.topic, _type) not in _BY_TOPIC_TYPE or _type == ev.PreemptJob.TYPE, (_rule.topic, _type)
        _BY_TOPIC_TYPE.setdefault((_rule.topic, _type), _rule)


_SIGNED_TOPICS = frozenset(r.topic for r in RULES if r.proof == SERVICE_SIGNATURE)
SIGNING_SERVICES = tuple(dict.fromkeys(name for r in RULES if r.proof == SERVICE_SIGNATURE for name in r.senders))


def rule_for(topic: str, event_type: str) -> Rule | None:
    """The rule for a message type on a topic (None: the topic never carries that type: refuse it)."""
    return _BY_TOPIC_TYPE.get((topic, event_type))


def signed_topic(topic: str) -> bool:
    """Whether receivers on ``topic`` know the sender by a service's signature (the outbox signs only there:
    on the event topics the store is the proof, and a signature would cost CPU for nothing)."""
    return topic in _SIGNED_TOPICS


def senders_of(topic: str) -> tuple[str, ...]:
    """Every sender some rule lets send on ``topic``, in the table's order."""
    return tuple(dict.fromkeys(name for r in RULES if r.topic == topic for name in r.senders))


def within_window(signed_at: str | None, now: float, max_age_s: float | None) -> bool:
    """Whether a message signed at ``signed_at`` (Unix seconds, text) may still be believed at ``now``."""
    try:
        at = float(signed_at or "nan")
    except ValueError:
        return False
    return math.isfinite(at) and at <= now + MAX_SKEW_S and (max_age_s is None or at >= now - max_age_s)


def provision_service_keys(directory: Path) -> str:
    """Make (or keep) the key of every service that signs (``<directory>/<service>.key``, mode 0600) and
    return what agents are told to trust: the command senders' ``<sender>=<key id>:<public key>`` entries."""
    keys = {name: signing.ensure_key_file(directory / f"{name}.key") for name in SIGNING_SERVICES}
    return ",".join(signing.trusted_entry(keys[name], name) for name in senders_of(NODES_COMMANDS.name))


def may_send(topic: str, event_type: str, sender: str) -> bool:
    """Whether ``sender`` (a service's name) may send ``event_type`` on ``topic``."""
    return any(r.topic == topic and event_type in r.types and sender in r.senders for r in RULES)


class RefusalCounts:
    """Messages a receiver refused, counted per (topic, reason, sender): in memory for the log (the 1st,
    10th, 100th and every 1,000th) and in the store, one row per key (``refused_messages``), so a flood of
    forgeries costs a counter, never a row each. ``sender`` is a known key's node or service, else ``-``."""

    def __init__(self, receiver: str) -> None:
        self.receiver = receiver
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._pending: Counter[tuple[str, str, str]] = Counter()
        self._detail: dict[tuple[str, str, str], str] = {}

    def note(self, topic: str, code: str, sender: str, detail: str) -> None:
        """Count one refusal (written to the store by the next ``flush``)."""
        key = (topic[:100], code[:40], (sender or "-")[:128])
        self.counts[key] += 1
        self._pending[key] += 1
        self._detail[key] = detail[:500]
        total = sum(self.counts.values())
        if total in (1, 10, 100) or total % 1000 == 0:
            log.warning("%s refused %d message(s) (%s); the latest on %s: %s", self.receiver, total,
                        ", ".join(f"{c}: {n}" for (_, c, _), n in sorted(self.counts.items())), topic, detail)

    def total(self) -> int:
        return sum(self.counts.values())

    async def record(self, conn: asyncpg.Connection, topic: str, code: str, sender: str, detail: str,
                     now: datetime) -> None:
        """Count one refusal and write the counters (in the caller's transaction)."""
        self.note(topic, code, sender, detail)
        await self.flush(conn, now)

    async def flush(self, conn: asyncpg.Connection, now: datetime) -> None:
        """Add the refusals counted since the last flush to the store's counters."""
        pending, self._pending = self._pending, Counter()
        if not pending:
            return
        try:
            await conn.executemany(
                "INSERT INTO refused_messages (receiver, topic, reason, sender, refused, first_at, last_at,"
                " last_detail) VALUES ($1, $2, $3, $4, $5, $6, $6, $7) ON CONFLICT (receiver, topic, reason, sender)"
                " DO UPDATE SET refused = refused_messages.refused + $5, last_at = $6, last_detail = $7",
                [(self.receiver, *key, n, now, self._detail.get(key, "")) for key, n in sorted(pending.items())])
        except BaseException:
            self._pending.update(pending)  # written by the next flush
            raise


async def refusal_counts(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT receiver, topic, reason, sender, refused, first_at, last_at, last_detail"
                            " FROM refused_messages ORDER BY receiver, topic, reason, sender")
