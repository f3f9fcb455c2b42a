"""Image jobs and gangs (pure): the runtime's command line, where an image job may go, what a gang's
members learn (torchrun's own variables among them), and node selectors in placement."""

from __future__ import annotations

import pytest

from gpusched_core import placement as engine
from gpusched_core.agent.container import (
    ContainerRun,
    apptainer_command,
    container_name,
    env_file_text,
    remove_command,
    run_command,
)
from gpusched_core.placement.cycle import (
    GpuRow,
    Member,
    NodeRow,
    Placement,
    build_cluster,
    pending_from_spec,
    plan_cycle,
    required_labels,
)
from gpusched_core.placement.launch import MASTER_PORTS, gang_env, master_port, start_commands
from gpusched_core.placement.model import CONTAINERS_LABEL
from tests.builders import a_job

RUN = ContainerRun("j-1", "node-1", 2, "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", (), "/var/gpusched/jobs/j-1",
                   devices=("GPU-aaaa", "MIG-bbbb"), cpu_milli=1500, memory_mib=2048, user=(1001, 1001))


def test_an_image_job_runs_its_entrypoint_with_exactly_its_devices_and_its_environment_by_name():
    env = {"PATH": "/usr/bin", "HOME": "/x", "CUDA_VISIBLE_DEVICES": "3", "SECRET_TOKEN": "hunter2",
           "GPUSCHED_JOB_ID": "j-1"}
    argv = run_command(["podman"], RUN, env)
    assert argv[:3] == ["podman", "run", "--rm"]
    assert argv[-1] == RUN.image and "--entrypoint" not in argv  # no command: the image's entrypoint
    assert ["--device", "nvidia.com/gpu=GPU-aaaa"] == argv[argv.index("nvidia.com/gpu=GPU-aaaa") - 1:][:2]
    assert "nvidia.com/gpu=MIG-bbbb" in argv
    assert "hunter2" not in " ".join(argv)  # values travel in the runtime's environment, not its arguments
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
    assert names == ["GPUSCHED_JOB_ID", "SECRET_TOKEN"]  # not the host's PATH/HOME, not host GPU indices
    assert argv[argv.index("--cpus") + 1] == "1.5" and argv[argv.index("--memory") + 1] == "2048m"
    assert argv[argv.index("--user") + 1] == "1001:1001"
    assert argv[argv.index("--volume") + 1] == "/var/gpusched/jobs/j-1:/var/gpusched/jobs/j-1"
    assert argv[argv.index("--network") + 1] == "host"


def test_without_devices_the_host_s_gpu_indices_are_passed_and_a_command_follows_the_image():
    run = ContainerRun("j-1", "n", 1, "busybox", ("sh", "-c", "echo hi"), "/d")
    argv = run_command(["docker"], run, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert argv[-5:] == ["--entrypoint", "sh", "busybox", "-c", "echo hi"]
    assert "CUDA_VISIBLE_DEVICES" in argv and "--device" not in argv and "--cpus" not in argv


def test_a_container_s_name_is_unique_per_run_and_what_removes_it_names_it():
    assert container_name("node/1", "j 1", 3) == "gpusched-node_1-j_1-3"
    assert remove_command(["podman"], "n", "j", 1) == ["podman", "rm", "--force", "--time", "0", "gpusched-n-j-1"]


def test_an_image_job_needs_a_node_with_containers_besides_its_own_selector():
    spec = a_job("j").image("busybox").selector({"zone": "eu-1"}).spec()
    assert required_labels(spec) == ((CONTAINERS_LABEL, "true"), ("zone", "eu-1"))
    assert required_labels(a_job("j").spec()) == ()


def _node(node_id: str, labels: dict[str, str]) -> NodeRow:
    gpus = tuple(GpuRow(i, f"{node_id}-u{i}", "H100-80GB", 81559) for i in range(8))
    return NodeRow(node_id, 64_000, 512 * 1024, gpus, labels)


@pytest.mark.parametrize(("job", "placed_on", "reason"), [
    pytest.param(a_job("j").selector({"zone": "eu-2"}), "b", None, id="selector"),
    pytest.param(a_job("j").image("busybox"), "b", None, id="image-to-a-node-with-a-runtime"),
    pytest.param(a_job("j").selector({"zone": "us-1"}), None, "node selector zone=us-1 does not match", id="no-node"),
    pytest.param(a_job("j").image("busybox").selector({"zone": "eu-1"}), None,
                 "node selector zone=eu-1 does not match or no container runtime (the job has an image)",
                 id="image-and-selector-nowhere"),
    pytest.param(a_job("j").gpus(4).gang(2).selector({"zone": "eu-2"}), None, "zone=eu-2", id="gang-of-two-one-node"),
])
def test_placement_sends_a_job_only_to_nodes_with_its_labels(job, placed_on, reason):
    nodes = [_node("a", {"zone": "eu-1"}), _node("b", {"zone": "eu-2", CONTAINERS_LABEL: "true"})]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), [pending_from_spec("j", job.spec())],
                                       engine.make_policy("bestfit"), nodes)
    if placed_on is not None:
        assert [p.node_id for p in placements] == [placed_on]
    else:
        assert placements == [] and any(reason in r for r in deferrals[0].reasons), deferrals


GANG = Placement("j-9", "n-0", (0, 1), ("u0", "u1"), "H100-80GB", "r",
                 members=(Member("n-0", (0, 1), ("u0", "u1")), Member("n-1", (2, 3), ("u2", "u3"))))


def test_a_gang_member_learns_what_torchrun_and_pytorchjob_read():
    env = gang_env(GANG, 1, {"n-0": "host-0.example"}, attempt=1)
    port = str(master_port("j-9", 1))
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "host-0.example"
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == port
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("2", "1", "2")
    assert (env["WORLD_SIZE"], env["RANK"], env["NNODES"], env["NODE_RANK"]) == ("2", "1", "2", "1")


def test_a_job_s_own_processes_per_node_are_kept():
    assert gang_env(GANG, 0, {}, 1, {"PET_NPROC_PER_NODE": "1"})["PET_NPROC_PER_NODE"] == "1"


def test_every_member_gets_the_same_port_and_the_next_attempt_another():
    spec = a_job("j-9").gpus(2).gang(2).image("busybox").spec()
    starts = start_commands(GANG, spec, attempt=1, checkpoint_ref=None, hostnames={})
    assert len({s.env["MASTER_PORT"] for s in starts}) == 1 and [s.env["RANK"] for s in starts] == ["0", "1"]
    assert all(s.image == "busybox" for s in starts)
    assert MASTER_PORTS[0] <= master_port("j-9", 1) < MASTER_PORTS[1]
    assert master_port("j-9", 1) != master_port("j-9", 2)


def test_a_single_node_job_learns_no_gang():
    assert gang_env(Placement("j", "n", (0,), ("u",), "H100-80GB", "r"), 0, {}) == {}


def test_apptainer_runs_a_command_or_the_runscript_with_a_clean_environment_from_a_file():
    argv = apptainer_command(["apptainer"], RUN, "/d/.container-env")
    assert argv[:2] == ["apptainer", "run"] and argv[-1] == RUN.image  # no command: the runscript
    assert "--cleanenv" in argv and argv[argv.index("--env-file") + 1] == "/d/.container-env" and "--nv" in argv
    run = ContainerRun("j", "n", 1, "/images/train.sif", ("python", "train.py"), "/d")
    assert apptainer_command(["apptainer"], run, "/e")[-3:] == ["/images/train.sif", "python", "train.py"]
    assert "--nv" not in apptainer_command(["apptainer"], run, "/e")
    text = env_file_text({"PATH": "/x", "GREETING": "it's $HOME", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert text == "CUDA_VISIBLE_DEVICES=2,3\nGREETING='it'\"'\"'s $HOME'\n"  # quoted; the host's PATH stays out


def test_the_node_s_runtime_adds_the_operator_s_arguments_to_every_run(tmp_path):
    from services.node_agent.containers import ContainerRuntime
    runtime = ContainerRuntime(("podman", "--runtime", "runc"), ("--ulimit", "nproc=4096:4096"), devices=False)
    argv = runtime.command(ContainerRun("j", "n", 1, "busybox", (), str(tmp_path)), {})
    assert argv[:6] == ["podman", "--runtime", "runc", "run", "--ulimit", "nproc=4096:4096"] and runtime.keeps_containers
    assert runtime.labels() == {"gpusched.io/containers": "true", "gpusched.io/container-runtime": "podman"}
    apptainer = ContainerRuntime(("apptainer",), ("--contain",), devices=True)
    argv = apptainer.command(ContainerRun("j", "n", 1, "x.sif", ("true",), str(tmp_path)), {"A": "1"})
    assert argv[:3] == ["apptainer", "exec", "--contain"] and not apptainer.keeps_containers
    assert (tmp_path / ".container-env").read_text() == "A=1\n" and (tmp_path / ".container-env").stat().st_mode & 0o077 == 0


def test_an_image_s_entrypoint_runs_with_the_spec_s_args():
    run = ContainerRun("j", "n", 1, "vllm/vllm-openai:v0.6.3", (), "/d", args=("--model", "m"))
    assert run_command(["podman"], run, {})[-3:] == ["vllm/vllm-openai:v0.6.3", "--model", "m"]
    assert "--entrypoint" not in run_command(["podman"], run, {})
    argv = apptainer_command(["apptainer"], run, "/e")
    assert argv[1] == "run" and argv[-3:] == ["vllm/vllm-openai:v0.6.3", "--model", "m"]
