"""gpusched's Python client: the gateway's HTTP API (``Client``), configured like the ``gpusched`` command
(``GPUSCHED_SERVER``/``GPUSCHED_TOKEN`` or ``~/.config/gpusched/config.yaml``)."""

from gpusched_core.workloads import WorkloadError

from gpusched.client import ApiError, Client, job_body
from gpusched.config import ClientConfig, NoServer, resolve

__all__ = ["ApiError", "Client", "ClientConfig", "NoServer", "WorkloadError", "job_body", "resolve"]
