"""The decision cores stay pure (libs/core/gpusched_core/__init__.py): what they may import, and no clock,
random source or fresh id anywhere in them. A static check over every module, so a violation fails here
before it can make a decision unrepeatable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpusched_common
import gpusched_core
import services

CORE = Path(gpusched_core.__file__).parent
COMMON = Path(gpusched_common.__file__).parent
# The contract the cores may speak: the event payloads, resource names, ids and identities (pure modules
# themselves, so they are checked as cores are).
CONTRACT = ("gpusched_common.events", "gpusched_common.resources", "gpusched_common.ids",
            "gpusched_common.identity")
SERVICES = Path(services.__file__).parent
# the shared cores, the contract, and each service's own core (the decisions no other room makes)
MODULES = sorted([*CORE.rglob("*.py"), *(COMMON / "events").rglob("*.py"), COMMON / "resources.py",
                  COMMON / "ids.py", COMMON / "identity.py", *SERVICES.glob("*/core.py")])
ALLOWED = {"__future__", "collections", "dataclasses", "enum", "functools", "heapq", "itertools", "math",
           "operator", "re", "types", "typing", "zlib", "numpy", "pydantic", "yaml", "gpusched_core",
           "bisect", "statistics", "abc", "datetime", "decimal", "fractions", "string", "textwrap", "json",
           "hashlib",  # deterministic digests (a job id derived from an idempotency key)
           "shlex",  # quoting a value for a shell (a container runtime's environment file)
           "weakref",  # a snapshot's parent, held weakly: whether it is gone changes how much is compared, no result
           *CONTRACT}
# calls that read the clock, a random source or the environment
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"), ("datetime", "now"),
                   ("datetime", "utcnow"), ("date", "today"), ("uuid", "uuid4"), ("uuid", "uuid1"),
                   ("os", "getenv"), ("random", "random"), ("random", "choice"), ("random", "shuffle"),
                   ("np", "random")}


def _name(path: Path) -> str:
    return str(path.relative_to(SERVICES.parent if path.is_relative_to(SERVICES) else CORE.parent.parent))
def _imports(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_root(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {_root(f"{node.module}.{alias.name}") for alias in node.names}
    return found


def _root(name: str) -> str:
    """The top-level package, or the contract module a name lies in (``from gpusched_common import events``
    names ``gpusched_common.events``)."""
    return next((c for c in CONTRACT if name == c or name.startswith(c + ".")), name.split(".")[0])


def _calls(tree: ast.AST) -> set[tuple[str, str]]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found.add((node.value.id, node.attr))
    return found


def test_there_are_cores_to_check():
    assert {p.parent.name for p in MODULES} >= {"placement", "quota", "preemption"}


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_core_module_imports_nothing_but_the_standard_library_numpy_pydantic_yaml_and_cores(path):
    tree = ast.parse(path.read_text())
    assert _imports(tree) - ALLOWED == set()


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_a_core_module_reads_no_clock_random_source_or_environment(path):
    tree = ast.parse(path.read_text())
    assert _calls(tree) & FORBIDDEN_CALLS == set()
