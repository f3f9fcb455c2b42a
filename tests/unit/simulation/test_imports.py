"""The simulations build on the pure cores and the shared library only: no module of gpusched_simulation
imports a service (or the CLI), so they replay the live decisions without running any service."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gpusched_simulation

PACKAGE = Path(gpusched_simulation.__file__).parent
ALLOWED = {"gpusched_core", "gpusched_common", "gpusched_simulation", "numpy", *sys.stdlib_module_names}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_simulations_import_only_the_cores_the_common_library_and_themselves():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert {p.parent.name for p in modules} >= {"placement", "queue", "preemption", "traces"}
    outside = {str(p.relative_to(PACKAGE)): sorted(_imported_roots(p) - ALLOWED) for p in modules}
    assert {module: roots for module, roots in outside.items() if roots} == {}
