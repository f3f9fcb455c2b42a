"""The node's container runtime (``GPUSCHED_AGENT_CONTAINER_RUNTIME``): which one, what the node advertises
(the ``gpusched.io/containers`` label placement sends image jobs by), and removing a run's container when
its client was killed. The command line itself is ``gpusched_core.agent.container``'s."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpusched_common.files import write_private
from gpusched_core.agent.container import (
    CONTAINER_RUNTIMES,
    OCI_RUNTIMES,
    ContainerRun,
    apptainer_command,
    env_file_text,
    remove_command,
    run_command,
    runtime_name,
)
from gpusched_core.placement.model import CONTAINERS_LABEL

log = logging.getLogger(__name__)
RUNTIME_LABEL = "gpusched.io/container-runtime"


@dataclass(frozen=True)
class ContainerRuntime:
    """``runtime``: the command before ``run`` (``podman``, ``podman --runtime runc``); ``run_args``: what
    an operator adds to every ``run`` (``--ulimit nproc=4096:4096``); ``devices``: whether jobs get their GPUs
    as CDI devices (a real NVML node) or none (a simulated one)."""

    runtime: tuple[str, ...]
    run_args: tuple[str, ...] = ()
    devices: bool = True

    @property
    def name(self) -> str:
        return runtime_name(self.runtime) or self.runtime[0]

    def labels(self) -> dict[str, str]:
        return {CONTAINERS_LABEL: "true", RUNTIME_LABEL: self.name}

    @property
    def keeps_containers(self) -> bool:
        """Whether a container outlives a killed client (podman, docker), so it must be removed."""
        return runtime_name(self.runtime) in OCI_RUNTIMES

    def command(self, run: ContainerRun, env: Mapping[str, str]) -> list[str]:
        if not self.keeps_containers:  # apptainer: the environment in a private file of the job's
            env_file = Path(run.job_dir) / ".container-env"
            write_private(env_file, env_file_text(env))
            if run.user is not None:  # the runtime runs as the tenant's user: its file
                os.chown(env_file, *run.user)
            argv = apptainer_command(self.runtime, run, str(env_file))
            at = len(self.runtime) + 1
        else:
            argv = run_command(self.runtime, run, env)
            at = argv.index("run") + 1
        return [*argv[:at], *self.run_args, *argv[at:]]

    async def remove(self, node_id: str, job_id: str, attempt: int) -> None:
        """Remove the run's container now (its client was killed: the container would go on)."""
        if not self.keeps_containers:
            return
        argv = remove_command(self.runtime, node_id, job_id, attempt)
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
            async with asyncio.timeout(30):  # not wait_for: see gpusched_common.relay's _pump
                _, err = await proc.communicate()
        except (OSError, TimeoutError) as exc:
            log.warning("%s: could not remove the container of %s: %s", node_id, job_id, exc)
            return
        if proc.returncode not in (0, 1):  # 1: no such container (it had ended)
            log.warning("%s: removing the container of %s: %s", node_id, job_id, err.decode(errors="replace")[:300])


def container_runtime(setting: str, run_args: str, *, devices: bool) -> ContainerRuntime | None:
    """The runtime configured: ``auto`` (podman, docker, apptainer or singularity, the first found on PATH),
    ``none``, or a command
    line; None where the node runs no containers."""
    setting = setting.strip()
    if setting == "none":
        return None
    if setting == "auto":
        found = next((path for path in map(shutil.which, CONTAINER_RUNTIMES) if path), None)
        if found is None:
            return None
        argv: tuple[str, ...] = (found,)
    else:
        argv = tuple(shlex.split(setting))
        if not argv or shutil.which(argv[0]) is None:
            raise ValueError(f"GPUSCHED_AGENT_CONTAINER_RUNTIME={setting!r}: no such command on this node")
    return ContainerRuntime(argv, tuple(shlex.split(run_args)), devices=devices)
