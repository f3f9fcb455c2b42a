"""gpusched's Python client: the gateway's HTTP API (``Client``), configured like the ``gpusched`` command
(``GPUSCHED_SERVER``/``GPUSCHED_TOKEN`` or ``~/.config/gpusched/config.yaml``)."""

from gpusched.client import ApiError, Client
from gpusched.config import ClientConfig, NoServer, resolve

__all__ = ["ApiError", "Client", "ClientConfig", "NoServer", "resolve"]
