"""Where the traces are: ``$GPUSCHED_TRACES_DIR``, else ``../shared/traces`` next to the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[4]  # libs/simulation/gpusched_simulation/traces/ -> the checkout


def traces_dir() -> Path:
    env = os.environ.get("GPUSCHED_TRACES_DIR")
    if env:
        return Path(env)
    return REPOSITORY.parent / "shared" / "traces"
