"""The layout is the architecture (ARCHITECTURE.md): a static check over every module, so a shortcut from
one room into another fails here. Services import only the cores and the shell library, never another
service, and their SQL names only their own tables; the libraries (cores, shell, CLI, simulation) import no
service; no module grows past 400 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
LIBS = ROOT / "libs"
MAX_LINES = 400
MODULES = sorted(p for p in [*SERVICES.rglob("*.py"), *LIBS.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
                 if "egg-info" not in str(p))
SERVICE_MODULES = [p for p in MODULES if p.is_relative_to(SERVICES)]
LIB_MODULES = [p for p in MODULES if p.is_relative_to(LIBS)]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def imported_services(path: Path) -> set[str]:
    """The services a module imports (``services.<name>``), however it spells the import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "services" else [f"services.{a.name}" for a in node.names]
        found |= {name.split(".")[1] for name in names if name.startswith("services.")}
    return found


def test_there_are_modules_to_check():
    assert {p.relative_to(SERVICES).parts[0] for p in SERVICE_MODULES} >= {
        "admission", "quota", "placement", "preemption", "metrics", "node_agent"}
    assert {p.relative_to(LIBS).parts[0] for p in LIB_MODULES} == {"core", "common", "cli", "simulation"}


@pytest.mark.parametrize("path", SERVICE_MODULES, ids=_name)
def test_a_service_imports_no_other_service(path):
    own = path.relative_to(SERVICES).parts[0]
    assert imported_services(path) - {own} == set()


@pytest.mark.parametrize("path", LIB_MODULES, ids=_name)
def test_a_library_imports_no_service(path):
    assert imported_services(path) == set()


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_module_is_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_every_service_has_the_same_anatomy():
    for service in ("admission", "quota", "placement", "preemption", "metrics", "gateway"):
        present = {p.name for p in (SERVICES / service).glob("*.py")}
        assert {"settings.py", "handlers.py", "store.py", "app.py", "__main__.py"} <= present, service
    assert {"settings.py", "app.py", "__main__.py"} <= {p.name for p in (SERVICES / "node_agent").glob("*.py")}


# Who owns each table (writes it and reads it freely); everyone else goes through gpusched_common.stores.
# The event store and the jobs read model belong to every service (each appends through the lifecycle).
SHARED_TABLES = {"events", "jobs", "outbox", "inbox",
                 "refused_messages",  # every receiver counts what it refused (gpusched_common.senders)
                 "relay_terms"}  # every service's outbox relay (gpusched_common.relay)
TABLE_OWNERS = {
    "admission": {"admission_auth_failure_counts", "admission_rate_buckets", "submission_requests",
                  "producers"},  # producers: through gpusched_common.producers (operators issue them)
    "quota": {"quota_job_dependencies", "quota_policy_history", "quota_policy_pending", "quota_policy_reservations", "quota_policy_usage",
              "quota_reclaims", "quota_tenancy_rejections", "quota_tenancy_revisions"},
    "placement": {"gpu_allocations", "gpu_nominations", "gpus", "nodes", "placement_pending", "placement_version",
                  "join_tokens", "node_keys", "placement_starts", "node_drift"},  # the keys: through gpusched_common.node_keys (operators issue tokens)
    "preemption": {"preemption_evaluations", "reclaim_victims"},
    "metrics": {"cluster_utilization", "metrics_scaler_state", "scale_decisions", "gpu_telemetry", "usage_samples"},
    "gateway": {"api_tokens"},  # through gpusched_common.tokens; its own SQL reads only the shared tables
}
_TABLE_REFERENCE = re.compile(r"(?<!epoch )\b(?:FROM|JOIN|INTO|UPDATE)\s+([a-z_]+)")  # not extract(epoch FROM x)
_NOT_TABLES = {"unnest", "generate_series", "lateral", "jsonb_to_recordset"}


def tables_named(path: Path) -> set[str]:
    """The tables a module's SQL names (in its string literals)."""
    strings = [node.value for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return {m.group(1) for text in strings for m in _TABLE_REFERENCE.finditer(text)} - _NOT_TABLES


@pytest.mark.parametrize("service", sorted(TABLE_OWNERS))
def test_a_service_s_sql_names_only_its_own_tables_and_the_event_store(service):
    if not (SERVICES / service).is_dir():
        pytest.skip(f"services/{service} does not exist yet")
    named = set().union(*(tables_named(p) for p in (SERVICES / service).rglob("*.py")))
    assert named, service
    assert named - TABLE_OWNERS[service] - SHARED_TABLES == set()


def test_the_cli_reads_other_rooms_tables_only_through_the_store_functions():
    cli = LIBS / "cli" / "gpusched_cli"
    named = set().union(*(tables_named(p) for p in cli.rglob("*.py")))
    assert named - SHARED_TABLES == {"bench_floor", "bench_events"}  # the floor benchmarks' own temporary tables


def test_every_table_of_the_migrations_has_an_owner():
    created = set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?([a-z_]+)",
                             "".join(p.read_text() for p in (ROOT / "deploy" / "migrations").glob("*.sql"))))
    owned = set().union(*TABLE_OWNERS.values()) | SHARED_TABLES
    derived = {"gpu_usage", "mig_slices", "host_usage", "quota_ledger", "quota_pending",  # kept by triggers, or retired
               "admission_auth_failures"}
    assert created - owned == derived


def test_the_checker_sees_a_cross_service_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from services.placement.store import x\nimport services.quota.store\n"
                      "from services import preemption\n")
    assert imported_services(module) == {"placement", "quota", "preemption"}
