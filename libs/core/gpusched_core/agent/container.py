"""How a node agent runs a job of an image (pure): the container runtime's command line (podman or docker;
apptainer and singularity, ``apptainer_command``, at the end).

The job's shell wrapper runs it in the foreground (``podman run``/``docker run`` without a TTY), so the
agent's stops reach the job as they reach a host process: SIGTERM goes to the runtime, which passes it
to the container (``--sig-proxy``, the default), and a SIGKILL of the process group at the deadline is
followed by ``remove_command`` (the container would outlive its client). The container sees:

- exactly its GPUs, as CDI devices (``nvidia.com/gpu=<uuid>``: whole GPUs and MIG instances alike; the
  node's CDI spec is generated with ``nvidia-ctk cdi generate --device-name-strategy=uuid``). Without
  devices (a simulated node) ``CUDA_VISIBLE_DEVICES`` is passed as on a host;
- the job's environment by name only (``--env NAME``: the values come from the runtime's own
  environment, so none appears in a process list), never the host's ``PATH``, ``HOME`` or locale (the
  image's own apply);
- its job directory at the same path (its checkpoint file, its preemption notice), as working directory;
- an init process as PID 1 (``--init``), so the job itself gets SIGTERM and can checkpoint;
- the host network (a gang's members reach ``MASTER_ADDR:MASTER_PORT``), its CPU and memory as the
  runtime's limits, the user the node runs the tenant's jobs as, and the MPS pipe for a GPU share.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CONTAINER_RUNTIMES = ("podman", "docker", "apptainer", "singularity")
OCI_RUNTIMES = ("podman", "docker")  # a daemon or conmon keeps the container: named, labelled, removed
# what the runtime takes from the host, never into the container: the image's own PATH and home apply;
# with CDI devices the GPUs are renumbered from 0 inside, so the host's indices would be wrong
HOST_ONLY = frozenset({"PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM"})
DEVICE_VARIABLES = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})


@dataclass(frozen=True)
class ContainerRun:
    """What one run of an image job needs of the runtime."""

    job_id: str
    node_id: str
    attempt: int
    image: str
    command: Sequence[str]  # what runs, in place of the image's entrypoint (empty: the entrypoint)
    job_dir: str
    devices: Sequence[str] = ()  # GPU or MIG device UUIDs (empty: no GPU devices, a simulated node)
    cpu_milli: int = 0
    memory_mib: int = 0
    user: tuple[int, int] | None = None  # uid, gid (None: the image's user)
    mps_pipe_dir: str | None = None
    args: Sequence[str] = ()  # with no command: the entrypoint's arguments


def container_name(node_id: str, job_id: str, attempt: int) -> str:
    """The container's name: the node, the job and the run (unique on the node; a runtime's name charset)."""
    raw = f"gpusched-{node_id}-{job_id}-{attempt}"
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in raw)[:200]


def run_command(runtime: Sequence[str], run: ContainerRun, env: Mapping[str, str]) -> list[str]:
    """``<runtime> run ...`` for ``run``; ``env`` is the job's whole environment (its names are passed)."""
    argv = [*runtime, "run", "--rm", "--name", container_name(run.node_id, run.job_id, run.attempt),
            "--label", f"gpusched.job={run.job_id}", "--label", f"gpusched.node={run.node_id}",
            "--label", f"gpusched.dir={run.job_dir}", "--init", "--network", "host", "--volume", f"{run.job_dir}:{run.job_dir}", "--workdir", run.job_dir]
    for device in run.devices:
        argv += ["--device", f"nvidia.com/gpu={device}"]
    if run.cpu_milli:
        argv += ["--cpus", f"{run.cpu_milli / 1000:g}"]
    if run.memory_mib:
        argv += ["--memory", f"{run.memory_mib}m"]
    if run.user is not None:
        argv += ["--user", f"{run.user[0]}:{run.user[1]}"]
    if run.mps_pipe_dir:
        argv += ["--volume", f"{run.mps_pipe_dir}:{run.mps_pipe_dir}"]
    skipped = HOST_ONLY | (DEVICE_VARIABLES if run.devices else frozenset())
    for name in sorted(env):
        if name not in skipped:
            argv += ["--env", name]
    if run.command:  # the spec's command replaces the image's entrypoint (as a pod's ``command`` does)
        argv += ["--entrypoint", run.command[0]]
        return [*argv, run.image, *run.command[1:]]
    return [*argv, run.image, *run.args]


def apptainer_command(runtime: Sequence[str], run: ContainerRun, env_file: str) -> list[str]:
    """``apptainer exec`` (a command) or ``apptainer run`` (the image's runscript) for ``run``: a clean
    environment read from ``env_file`` (the shell writes it, private to the job), the job directory bound
    and as working directory, and the node's GPUs with ``--nv`` where the job has devices. Apptainer has no
    per-device option: ``--nv`` binds the driver and the devices, and ``CUDA_VISIBLE_DEVICES`` (passed)
    names the job's. Its processes are children of the runtime's: the job's process group is all of it."""
    argv = [*runtime, "exec" if run.command else "run", "--cleanenv", "--env-file", env_file,
            "--bind", run.job_dir, "--pwd", run.job_dir]
    if run.devices:
        argv.append("--nv")
    return [*argv, run.image, *(run.command or run.args)]


def env_file_text(env: Mapping[str, str]) -> str:
    """The job's environment as an apptainer ``--env-file`` (shell assignments, each value quoted)."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in sorted(env.items())
                   if name not in HOST_ONLY)


def remove_command(runtime: Sequence[str], node_id: str, job_id: str, attempt: int) -> list[str]:
    """What removes the run's container at once (after its client was killed)."""
    return [*runtime, "rm", "--force", "--time", "0", container_name(node_id, job_id, attempt)]


def runtime_name(runtime: Sequence[str]) -> str | None:
    """Which runtime a configured command line is (``podman``, ``docker``), None for none or another."""
    if not runtime:
        return None
    name = runtime[0].rsplit("/", 1)[-1]
    return name if name in CONTAINER_RUNTIMES else None
