"""Export every event model as JSON Schema into `schemas/` (`gpusched export-schemas`)."""

from __future__ import annotations

import json
from pathlib import Path

from gpusched_common.events import PAYLOAD_TYPES, Envelope


def render_schemas() -> dict[str, str]:
    """File name -> JSON text, for the envelope and every payload type."""
    files = {"Envelope.json": Envelope.model_json_schema()}
    for name, model in sorted(PAYLOAD_TYPES.items()):
        schema = model.model_json_schema()
        schema["x-schema-version"] = model.SCHEMA_VERSION
        files[f"{name}.v{model.SCHEMA_VERSION}.json"] = schema
    return {name: json.dumps(schema, indent=2, sort_keys=True) + "\n" for name, schema in files.items()}


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_schemas().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
