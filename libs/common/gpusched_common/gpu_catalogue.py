"""The operator's GPU catalogue file (GPUSCHED_GPU_CATALOGUE): aliases and display names of GPU models,
read once at start and handed to the pure code (``gpusched_core.gpu_models.load_catalogue`` says what
it holds and checks it). No file set: the normaliser's rule alone."""

from __future__ import annotations

import logging
from pathlib import Path

from gpusched_core.gpu_models import Catalogue, CatalogueError, load_catalogue

log = logging.getLogger(__name__)
MAX_CATALOGUE_BYTES = 1024 * 1024


def read_catalogue(path: Path | None) -> Catalogue:
    """The catalogue in ``path`` (None: an empty one); raises ``CatalogueError`` with every problem, or
    for a file that cannot be read."""
    if path is None:
        return Catalogue()
    try:
        if path.stat().st_size > MAX_CATALOGUE_BYTES:
            raise CatalogueError(str(path), [f"is larger than {MAX_CATALOGUE_BYTES} bytes"])
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogueError(str(path), [f"cannot be read: {exc}"]) from exc
    catalogue = load_catalogue(text, str(path))
    log.info("GPU catalogue: %d model(s) from %s", len(catalogue.models), path)
    return catalogue
