"""The table of inbox readers the outbox relay trusts (``topics.INBOX_READERS``) against what the services
subscribe to and the message types they claim: a reader left out of it, or a type it claims left out, would
miss the messages a broker lost, so every transactional subscription must be in it with exactly the types its
handler claims, and no topic read without an inbox may be."""

from __future__ import annotations

import re
from pathlib import Path

from gpusched_common import topics

SERVICES = Path(__file__).resolve().parents[2] / "services"
_SUBSCRIPTION = re.compile(r"\bsubscribe(_transactional)?\(\s*(\w+)\.name")


def _subscriptions() -> set[tuple[str, str, bool]]:
    """(service, topic, transactional) for every subscription in the services' sources."""
    found = set()
    for source in SERVICES.glob("*/*.py"):
        for transactional, constant in _SUBSCRIPTION.findall(source.read_text()):
            found.add((source.parent.name, getattr(topics, constant).name, bool(transactional)))
    return found


def _service_name(directory: str) -> str:
    names = {m for source in (SERVICES / directory).glob("*.py")
             for m in re.findall(r'^SERVICE = "([^"]+)"', source.read_text(), re.M)}
    assert len(names) == 1, (directory, names)
    return names.pop()


def test_every_transactional_reader_is_named_and_no_reader_without_an_inbox():
    subscriptions = _subscriptions()
    assert ("admission", topics.JOBS_SUBMITTED.name, True) in subscriptions  # the scan finds what it should
    assert ("node_agent", topics.NODES_COMMANDS.name, False) in subscriptions
    named = {(reader, topic) for topic, readers in topics.INBOX_READERS.items() for reader in readers}
    transactional = {(_service_name(s), t) for s, t, tx in subscriptions if tx}
    assert transactional == named
    without_inbox = {t for s, t, tx in subscriptions if not tx}
    assert not without_inbox & set(topics.INBOX_READERS)


def test_the_job_events_each_reader_claims_are_the_types_the_table_names():
    from services.placement import handlers as placement
    from services.preemption import handlers as preemption
    from services.quota import handlers as quota

    claimed = {"quota": quota.CLAIMED_JOB_EVENTS, "placement": placement.CLAIMED_JOB_EVENTS,
               "preemption": preemption.CLAIMED_JOB_EVENTS}
    table = topics.INBOX_READERS[topics.JOBS_EVENTS.name]
    assert set(table) == set(claimed)
    for reader, classes in claimed.items():
        assert table[reader] == frozenset(c.TYPE for c in classes), reader
    assert topics.inbox_readers_of(topics.JOBS_EVENTS.name, "JobCancelled") == {"quota", "placement"}
    assert topics.inbox_readers_of(topics.JOBS_EVENTS.name, "QuotaDeferred") == frozenset()  # nobody claims it
    assert topics.inbox_readers_of(topics.JOBS_EVENTS.name, None) == set(table)  # unknown type: every reader
    assert topics.inbox_readers_of(topics.NODES_REPORTS.name, "NodeHeartbeat") == {"placement"}


def test_consumers_of_a_background_topic_fetch_with_the_longer_wait_and_the_job_path_keeps_its_own():
    from gpusched_common.messaging import consumer_options
    from gpusched_common.settings import Settings

    tansu = Settings(kafka_fetch_max_wait_ms=50)  # what the local stack on Tansu sets
    for topic in (topics.JOBS_CONTROL, topics.QUOTA_RECLAIMS, topics.TENANCY_UPDATES):
        assert consumer_options(tansu, "g", topic.name)["fetch_max_wait_ms"] == 500, topic.name
    for topic in (topics.JOBS_SUBMITTED, topics.JOBS_EVENTS, topics.NODES_REPORTS, topics.NODES_COMMANDS):
        assert consumer_options(tansu, "g", topic.name)["fetch_max_wait_ms"] == 50, topic.name
    assert consumer_options(tansu, "g")["fetch_max_wait_ms"] == 50
    # never shorter than the general setting: a deployment that waits longer everywhere keeps it
    slow = Settings(kafka_fetch_max_wait_ms=800, kafka_fetch_max_wait_background_ms=300)
    assert consumer_options(slow, "g", topics.JOBS_CONTROL.name)["fetch_max_wait_ms"] == 800


class _Recording:
    """A broker that records what each subscription asks of its consumer."""

    def __init__(self) -> None:
        self.options: dict[str, dict] = {}

    def subscriber(self, topic: str, **options):
        self.options[topic] = options
        return lambda handler: handler


def test_both_subscription_paths_give_a_background_topic_consumer_its_wait():
    from gpusched_common.batching import subscribe_transactional
    from gpusched_common.messaging import subscribe
    from gpusched_common.settings import Settings

    tansu, broker = Settings(kafka_fetch_max_wait_ms=50), _Recording()
    for topic in (topics.JOBS_CONTROL, topics.JOBS_EVENTS):
        subscribe_transactional(broker, None, topic=topic.name, group_id="g", service="placement", settings=tansu,
                                handler=None)
    subscribe(broker, topic=topics.TENANCY_UPDATES.name, group_id="g", service="quota", settings=tansu,
              handler=None)
    assert broker.options[topics.JOBS_CONTROL.name]["fetch_max_wait_ms"] == 500
    assert broker.options[topics.TENANCY_UPDATES.name]["fetch_max_wait_ms"] == 500
    assert broker.options[topics.JOBS_EVENTS.name]["fetch_max_wait_ms"] == 50
