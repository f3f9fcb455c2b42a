"""Settings for the operator commands that work on the database or the broker themselves (migrate,
create-topics, tokens, producers, tenants apply): from the environment, pointed at the local stack when
one is up and nothing is set. Users' commands go through the gateway instead (``gpusched.Client``)."""

from __future__ import annotations

import os

from gpusched_common.settings import Settings

from gpusched_cli import stack


def operator_settings() -> Settings:
    """Settings from the environment, pointed at the local stack when one is up and nothing is set."""
    state = stack.load()
    if state is not None:
        os.environ.setdefault("GPUSCHED_DATABASE_URL", state.database_url)
        os.environ.setdefault("GPUSCHED_KAFKA_BOOTSTRAP", state.kafka_bootstrap)
        if "GPUSCHED_TENANT_KEYS_FILE" in state.env:
            os.environ.setdefault("GPUSCHED_TENANT_KEYS_FILE", state.env["GPUSCHED_TENANT_KEYS_FILE"])
    return Settings()
