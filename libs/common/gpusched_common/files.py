"""Files gpusched writes whole: keys, tokens, the agents' records. Each is written beside its place and
renamed over it, so a reader (or a restart after a crash) sees the old content or the new, never half;
private ones are mode 0600 from their first byte, whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path


def _replace(path: Path, text: str, mode: int) -> None:
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an older partial file of another mode, or the umask, cannot widen it
        with os.fdopen(fd, "w") as f:
            fd = -1
            f.write(text)
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(partial, path)


def write_private(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``, readable by its owner alone (0600)."""
    _replace(path, text, 0o600)


def write_public(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text``, readable by everyone (0644: public keys, never secrets)."""
    _replace(path, text, 0o644)
