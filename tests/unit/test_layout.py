"""The layout is the architecture (ARCHITECTURE.md): a static check over every module, so a shortcut from
one room into another fails here. Services import only the cores and the shell library, never another
service; the libraries (cores, shell, CLI, simulation) import no service; no module grows past 400 lines."""

from __future__ import annotations

import ast
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
    for service in ("admission", "quota", "placement", "preemption", "metrics"):
        present = {p.name for p in (SERVICES / service).glob("*.py")}
        assert {"settings.py", "handlers.py", "store.py", "app.py", "__main__.py"} <= present, service
    assert {"settings.py", "app.py", "__main__.py"} <= {p.name for p in (SERVICES / "node_agent").glob("*.py")}


def test_the_checker_sees_a_cross_service_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from services.placement.store import x\nimport services.quota.store\n"
                      "from services import preemption\n")
    assert imported_services(module) == {"placement", "quota", "preemption"}
