"""Jobs of an image run in a real container (podman here; no image registry is reachable, so the image is
imported from a tarball of busybox): the image's entrypoint when the spec has no command, the job's
environment inside, its exit code out, and a stop that leaves no container behind. Skipped, with what the
runtime said, where no container runtime runs on this machine."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_gateway import cli
from tests.e2e.test_job_control import token_for
from tests.e2e.test_pipeline import job_view

IMAGE = "localhost/gpusched-e2e-busybox:1"
ECHO_IMAGE = "localhost/gpusched-e2e-echo:1"  # its entrypoint echoes its arguments
STACK_NODES = 1
STACK_GPU_MODELS = ["H100-80GB"]
STACK_GPUS_PER_NODE = 2


def _candidates() -> list[tuple[str, str]]:
    """Runtime command lines to try, the plain one first. Inside some sandboxes (this CI's microVM: cgroup v1
    and a kernel that refuses raising RLIMIT_NPROC inside the container) crun cannot start containers and runc
    can with limits at most the host's; an operator sets the same through the agent's two settings."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = f"--ulimit nofile={nofile[0]}:{nofile[1]} --ulimit nproc=4096:4096"
    out = [("podman", ""), ("podman", lowered)]
    if shutil.which("runc"):
        out.append(("podman --runtime runc", lowered))
    return out


def _image_and_runtime() -> tuple[str, str] | str:
    """Import the busybox image and find a runtime command line that runs it; or why there is none."""
    podman, busybox = shutil.which("podman"), shutil.which("busybox")
    if podman is None or busybox is None:
        return "podman or busybox is not installed (.ci/run installs both from Debian)"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "rootfs"
        (root / "bin").mkdir(parents=True)
        shutil.copy(busybox, root / "bin" / "busybox")
        for applet in ("sh", "echo", "env", "sleep", "cat", "test"):
            (root / "bin" / applet).symlink_to("busybox")
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(tarball), "."], check=True)
        imported = subprocess.run([podman, "import", "--change", 'ENTRYPOINT ["/bin/sh", "-c", "echo entrypoint ran; exit 7"]',
                                   str(tarball), IMAGE], capture_output=True, text=True, timeout=120)
        if imported.returncode != 0:
            return f"podman import failed: {imported.stderr.strip()[-300:]}"
        subprocess.run([podman, "import", "--change", 'ENTRYPOINT ["/bin/echo", "entry:"]', str(tarball), ECHO_IMAGE],
                       capture_output=True, text=True, timeout=120, check=True)
    said = []
    for runtime, args in _candidates():
        probe = subprocess.run([*runtime.split(), "run", "--rm", *args.split(), "--entrypoint", "echo", IMAGE, "ok"],
                               capture_output=True, text=True, timeout=120)
        if probe.returncode == 0 and probe.stdout.strip() == "ok":
            return runtime, args
        said.append(f"{runtime} {args}: {probe.stderr.strip()[-200:]}")
    return "no container runs here: " + " | ".join(said)


FOUND = _image_and_runtime()
if isinstance(FOUND, str):
    pytest.skip(FOUND, allow_module_level=True)
STACK_ENV = {"GPUSCHED_AGENT_CONTAINER_RUNTIME": FOUND[0], "GPUSCHED_AGENT_CONTAINER_RUN_ARGS": FOUND[1]}


async def _log(local_stack, job_id: str) -> str:
    paths = list(Path(local_stack.home).rglob(f"jobs/{job_id}.log")) + list(Path(local_stack.home).rglob(f"{job_id}.log"))
    return "\n".join(p.read_text(errors="replace") for p in paths)


async def test_an_image_without_a_command_runs_its_entrypoint_and_its_exit_code_comes_out(local_stack, stack_settings):
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("c").command().image(IMAGE).spec())
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=120, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Failed" and job["exit_code"] == 7, job
    assert "entrypoint ran" in await _log(local_stack, job_id)


async def test_a_command_runs_in_the_container_with_the_job_s_environment_and_files(local_stack, stack_settings):
    check = ('test "$GREETING" = hello && test -n "$GPUSCHED_JOB_ID" && test "$(pwd)" = "$GPUSCHED_JOB_DIR" '
             '&& test "$(echo "$CUDA_VISIBLE_DEVICES" | tr , " " | wc -w)" = 1 && echo ckpt-1 > "$GPUSCHED_CHECKPOINT_FILE" && echo inside')
    spec = a_job("c").image(IMAGE).command("sh", "-c", check).spec().model_copy(update={"env": {"GREETING": "hello"}})
    async with Client(stack_settings) as client:
        job_id = await client.submit(spec)
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=120, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Succeeded", (job, await _log(local_stack, job_id))
    assert "inside" in await _log(local_stack, job_id)


POD = """apiVersion: v1
kind: Pod
metadata: {name: echo-server, namespace: research}
spec:
  containers:
  - name: server
    image: %s
    args: ["hello", "from", "the", "pod"]
    resources: {limits: {nvidia.com/gpu: 1}}
"""


async def test_a_pod_file_with_an_image_and_args_runs_the_entrypoint_with_them(local_stack, tmp_path):
    path = tmp_path / "pod.yaml"
    path.write_text(POD % ECHO_IMAGE)
    token = await token_for(local_stack, "user", "research", "pod-submitter")
    submitted = await asyncio.to_thread(cli, local_stack, token, "submit", "-f", str(path), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"] if submitted.stdout.strip().startswith("{") else \
        json.loads(submitted.stdout)[0]["job_id"]
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=120, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Succeeded", (job, await _log(local_stack, job_id))
    assert "entry: hello from the pod" in await _log(local_stack, job_id)


async def test_a_cancelled_container_job_leaves_no_container(local_stack, stack_settings):
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("c").image(IMAGE).command("sleep", "600").spec())
        deadline = asyncio.get_running_loop().time() + 120
        while ((await job_view(local_stack.database_url, job_id)) or {}).get("status") != "Running":
            assert asyncio.get_running_loop().time() < deadline, "the container job never ran"
            await asyncio.sleep(0.2)
    token = await token_for(local_stack, "operator", None, "container-canceller")
    cancelled = await asyncio.to_thread(cli, local_stack, token, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=120, interval_s=0.2)
    assert (await job_view(local_stack.database_url, job_id))["status"] == "Cancelled"
    deadline = asyncio.get_running_loop().time() + 60
    while _containers_of(job_id):
        assert asyncio.get_running_loop().time() < deadline, f"containers left: {_containers_of(job_id)}"
        await asyncio.sleep(0.5)


def _containers_of(job_id: str) -> list[str]:
    out = subprocess.run(["podman", "ps", "--all", "--format", "json", "--filter", f"label=gpusched.job={job_id}"],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    return [c.get("Names", ["?"])[0] for c in json.loads(out.stdout or "[]")]


async def test_stopping_the_stack_s_jobs_leaves_no_container(local_stack, stack_settings):
    """What `gpusched down` does once the agents are stopped: a job that ignores SIGTERM outlives the grace,
    its runtime client is killed with the job's process group, and its container, which would go on, is
    removed."""
    from gpusched_cli.teardown import stop_stack_jobs
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("c").image(IMAGE).command("sh", "-c", 'trap "" TERM; sleep 600').spec())
    deadline = asyncio.get_running_loop().time() + 120
    while not _containers_of(job_id):
        assert asyncio.get_running_loop().time() < deadline, "the container never started"
        await asyncio.sleep(0.2)
    lines: list[str] = []
    await asyncio.to_thread(stop_stack_jobs, local_stack.home, local_stack.env, lines.append, 1.0)
    assert _containers_of(job_id) == [], lines
    assert any(line.startswith("removed    1 job container") for line in lines), lines
