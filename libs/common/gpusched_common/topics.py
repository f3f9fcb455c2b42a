"""Every Kafka topic and its partition key, in one place (DESIGN.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Topic:
    name: str
    key: str  # what the partition key is, for readers of this module
    high_volume: bool = False
    # carries little, and nothing on it is waited for by the millisecond (a cancel, a tenancy revision, a
    # reclaim): its consumers fetch with the longer wait (Settings.kafka_fetch_max_wait_background_ms)
    background: bool = False


JOBS_SUBMITTED = Topic("gpusched.jobs.submitted", key="job id")
JOBS_EVENTS = Topic("gpusched.jobs.events", key="job id")
# cancel (and later hold, release): the gateway's
JOBS_CONTROL = Topic("gpusched.jobs.control", key="job id", background=True)
NODES_COMMANDS = Topic("gpusched.nodes.commands", key="node id")
NODES_REPORTS = Topic("gpusched.nodes.reports", key="node id")
NODES_TELEMETRY = Topic("gpusched.nodes.telemetry", key="node id", high_volume=True)
CLUSTER_SCALING = Topic("gpusched.cluster.scaling", key="GPU model")
QUOTA_RECLAIMS = Topic("gpusched.quota.reclaims", key="tenant", background=True)
TENANCY_UPDATES = Topic("gpusched.admin.tenancy", key="the constant 'tenancy' (one ordered stream)", background=True)
DEADLETTER = Topic("gpusched.deadletter", key="original key")

# The node commands' partitions when `create_topics` makes the topic (GPUSCHED_NODE_COMMAND_PARTITIONS): each
# agent reads only the partitions its nodes hash to (gpusched_common.partitioning), so at 1,000 nodes each
# partition carries ~16 nodes' commands. Set at creation: adding partitions later moves nodes' keys.
NODE_COMMAND_PARTITIONS = 64

ALL_TOPICS: tuple[Topic, ...] = (
    JOBS_SUBMITTED,
    JOBS_EVENTS,
    JOBS_CONTROL,
    NODES_COMMANDS,
    NODES_REPORTS,
    NODES_TELEMETRY,
    CLUSTER_SCALING,
    QUOTA_RECLAIMS,
    TENANCY_UPDATES,
    DEADLETTER,
)

BACKGROUND_TOPICS = frozenset(t.name for t in ALL_TOPICS if t.background)

# Consumer groups: one per service and topic it consumes, so each sees every event once (each
# subscription is its own consumer; the broker's ACLs name the same groups, infra/kafka_security.py).
GROUP_ADMISSION = "gpusched-admission"
GROUP_ADMISSION_CONTROL = f"{GROUP_ADMISSION}-control"
GROUP_QUOTA = "gpusched-quota"  # job events
GROUP_QUOTA_ADMIN = "gpusched-quota-admin"  # tenancy revisions
GROUP_PLACEMENT = "gpusched-placement"
GROUP_PLACEMENT_JOBS = f"{GROUP_PLACEMENT}-jobs"
GROUP_PLACEMENT_NODES = f"{GROUP_PLACEMENT}-nodes"
GROUP_PLACEMENT_CONTROL = f"{GROUP_PLACEMENT}-control"  # operators' node control (cordon)
GROUP_PREEMPTION = "gpusched-preemption"  # job events (the group's name from before reclaims existed)
GROUP_PREEMPTION_RECLAIMS = f"{GROUP_PREEMPTION}-reclaims"
GROUP_METRICS = "gpusched-metrics"


def agent_group(node_id: str) -> str:
    return f"gpusched-agent-{node_id}"


# The services that read each topic in a transaction and claim what they applied in their inbox under their
# name (``gpusched_common.store.claim``), with the message types each one claims there (None: every message
# it reads; a reader passes over the other types without a claim, needing nothing of them). A message that
# every reader of its type has claimed needs no second delivery, so the outbox relay does not publish it
# again to a broker that lost its data (nor one no reader claims at all). A topic with a reader that keeps no
# inbox (the agents' commands, an autoscaler's decisions) is not named: its messages always go again.
# tests/unit/test_topics.py checks this table against every service's subscriptions and type filters.
INBOX_READERS: dict[str, dict[str, frozenset[str] | None]] = {
    JOBS_SUBMITTED.name: {"admission": None},
    JOBS_EVENTS.name: {
        "quota": frozenset({"JobAdmitted", "JobPreempted", "JobHeld", "JobReleased", "JobSucceeded", "JobFailed",
                            "JobCancelled", "JobRejected"}),
        "placement": frozenset({"QuotaReserved", "JobCancelled", "JobCancelRequested", "JobHeld"}),
        "preemption": frozenset({"PlacementDeferred"}),
    },
    JOBS_CONTROL.name: {"admission": None, "placement": None},
    NODES_REPORTS.name: {"placement": None},
    QUOTA_RECLAIMS.name: {"preemption": None},
    TENANCY_UPDATES.name: {"quota": None},
}


def inbox_readers_of(topic: str, message_type: str | None) -> frozenset[str]:
    """The services whose inbox must hold a message of this type on this topic before the relay may leave it
    out of a republish (a type not known: every reader of the topic)."""
    return frozenset(reader for reader, types in INBOX_READERS.get(topic, {}).items()
                     if types is None or message_type is None or message_type in types)
