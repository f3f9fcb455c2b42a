"""What the simulations' sub-commands have in common when they report: progress lines on stderr, the
JSON document, relative changes. Tables render with ``gpusched_common.table.render``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


def stderr_log(quiet: bool) -> Callable[[str], None]:
    """A line printer for progress on stderr; prints nothing when ``quiet``."""

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    return log


def write_json(path: Path, document: object) -> None:
    """The results document at ``path`` (its folder made when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def percent_change(value: float, baseline: float) -> str:
    """``+12.3%``: how much ``value`` is above ``baseline`` (``n/a`` when the baseline is 0)."""
    return f"{(value / baseline - 1) * 100:+.1f}%" if baseline else "n/a"
