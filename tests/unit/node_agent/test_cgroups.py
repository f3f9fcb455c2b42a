"""Each job in its own cgroup (issue 14): the limits from its request (pure), detection of what a node can
enforce (v2, v1, none) on fake hierarchies, and, where this machine lets a root agent write its cgroups,
a real job held to its memory limit and moved in before its command ran."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from services.node_agent.cgroups import CPU_PERIOD_US, JobCgroups, Limits, detect, limits_for
from gpusched_common.job_records import signal_group
from services.node_agent.runner import JobExit, JobRunner


@pytest.mark.parametrize("cpu, memory, gpus, minors, expected", [
    (0, 0, (0,), {}, Limits(None, None, ())),
    (2500, 1024, (0,), {}, Limits(250_000, 1024 * 1024 * 1024, ())),
    (1, 1, (), {}, Limits(1000, 16 * 1024 * 1024, ())),  # floors: a limit that leaves the wrapper alive
    (1000, 0, (1, 3), {0: 0, 1: 1, 2: 2, 3: 3}, Limits(CPU_PERIOD_US, None, (0, 2))),
    (0, 0, (0,), {0: 4, 1: 5}, Limits(None, None, (5,))),  # minors, not indices, name the device files
])
def test_limits_follow_the_request_and_deny_the_other_gpus(cpu, memory, gpus, minors, expected):
    assert limits_for(cpu, memory, gpus, minors) == expected


def fake_v1(root: Path) -> Path:
    for controller, marker in (("cpu", "cpu.cfs_quota_us"), ("memory", "memory.limit_in_bytes"),
                               ("devices", "devices.deny")):
        (root / controller).mkdir(parents=True)
        (root / controller / marker).write_text("")
    return root


def test_v1_hierarchies_get_a_cgroup_per_job_under_the_agent_s_own(tmp_path):
    root = fake_v1(tmp_path)
    support = detect(root, proc_cgroup="4:memory:/pod/a\n1:cpu:/\n5:devices:/pod\n", has_devices=True, node_id="n1")
    assert support.mode == "v1" and "devices.deny" in support.devices
    assert dict(support.hierarchies)["memory"] == root / "memory" / "pod" / "a" / "gpusched" / "n1"
    cgroups = JobCgroups(support)
    assert cgroups.prepare("j1", Limits(50_000, 64 << 20, (2,))) == []
    assert (root / "cpu/gpusched/n1/j1/cpu.cfs_quota_us").read_text() == "50000"
    assert (root / "memory/pod/a/gpusched/n1/j1/memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (root / "devices/pod/gpusched/n1/j1/devices.deny").read_text() == "c 195:2 rwm"
    assert cgroups.memory_limit("j1") == 64 << 20


def test_v2_gets_cpu_max_and_memory_max_and_says_devices_are_not_limited(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    (tmp_path / "cgroup.subtree_control").write_text("")
    support = detect(tmp_path, proc_cgroup="0::/\n", node_id="n1")
    assert support.mode == "v2" and support.devices.startswith("not enforced")
    assert "+cpu +memory" in (tmp_path / "cgroup.subtree_control").read_text()
    cgroups = JobCgroups(support)
    cgroups.prepare("j1", Limits(150_000, 1 << 30, ()))
    assert (tmp_path / "gpusched/n1/j1/cpu.max").read_text() == f"150000 {CPU_PERIOD_US}"
    assert (tmp_path / "gpusched/n1/j1/memory.max").read_text() == str(1 << 30)
    assert "+cpu +memory" in (tmp_path / "gpusched/n1/cgroup.subtree_control").read_text()  # delegated to jobs


def test_a_node_without_writable_cgroups_says_nothing_is_enforced(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("hugetlb")
    support = detect(tmp_path, proc_cgroup="0::/\n")
    assert support.mode == "none" and all(v.startswith("not enforced") for v in support.isolation().values())
    assert detect(tmp_path / "nothing", proc_cgroup="").mode == "none"


REAL = detect(node_id=f"test-{os.getpid()}") if sys.platform == "linux" else None
needs_memory_cgroup = pytest.mark.skipif(
    REAL is None or os.geteuid() != 0 or "memory" not in {c if c != "v2" else "memory" for c, _ in REAL.hierarchies},
    reason="needs a root agent and a writable memory cgroup on this machine")


@needs_memory_cgroup
async def test_a_real_job_runs_in_its_cgroup_and_is_held_to_its_memory(tmp_path):
    runner = JobRunner(tmp_path / "node", cgroups=JobCgroups(REAL))
    allocate = [sys.executable, "-c", "b = bytearray(256 * 1024 * 1024); print('allocated')"]
    small = await runner.start("hog", allocate, (), {}, limits=limits_for(0, 64, (), {}))
    assert not isinstance(small, JobExit)
    assert runner.cgroups.memory_limit("hog") == 64 << 20
    ended = await asyncio.wait_for(runner.wait(small), 60)
    assert ended.exit_code != 0 and "allocated" not in runner.log_path("hog").read_text()  # killed at its limit
    assert runner.cgroups.memory_limit("hog") is None  # its cgroup is gone with it

    where = await runner.start("where", ["cat", "/proc/self/cgroup"], (), {}, limits=limits_for(500, 512, (), {}))
    assert (await asyncio.wait_for(runner.wait(where), 30)).exit_code == 0
    assert "/gpusched/" in runner.log_path("where").read_text()  # its command ran inside: moved before it ran
    roomy = await runner.start("roomy", allocate, (), {}, limits=limits_for(0, 1024, (), {}))
    assert (await asyncio.wait_for(runner.wait(roomy), 60)).exit_code == 0


@needs_memory_cgroup
async def test_a_restarted_agent_removes_the_cgroups_of_jobs_that_ended_unwatched(tmp_path):
    """A job killed while no agent watched it (``gpusched down``) leaves its cgroups; the next agent of the
    node removes them and keeps those of jobs still running."""
    runner = JobRunner(tmp_path / "node", cgroups=JobCgroups(REAL))
    limits = limits_for(500, 256, (), {})
    gone = await runner.start("gone", ["sleep", "600"], (), {}, limits=limits)
    kept = await runner.start("kept", ["sleep", "600"], (), {}, limits=limits)
    assert not isinstance(gone, JobExit) and not isinstance(kept, JobExit)
    try:
        signal_group(gone.pid, signal.SIGKILL)
        while runner.is_alive(gone):
            await asyncio.sleep(0.05)
        again = JobRunner(tmp_path / "node", cgroups=JobCgroups(REAL))  # the node's next agent
        # a killed process may still count in its cgroups a moment after it is seen gone: sweep until they went
        removed, deadline = 0, asyncio.get_running_loop().time() + 30
        while any((base / "gone").exists() for _, base in REAL.hierarchies):
            assert asyncio.get_running_loop().time() < deadline, "the ended job's cgroups were never removed"
            removed += again.sweep_cgroups()
            await asyncio.sleep(0.05)
        assert removed >= len(REAL.hierarchies)  # its own in each hierarchy (and any other leftover)
        assert all((base / "kept").exists() for _, base in REAL.hierarchies)
    finally:
        await runner.stop("kept")
        await asyncio.wait_for(runner.wait(kept), 30)
        await asyncio.wait_for(runner.wait(gone), 30)
    # the stopped job's cgroups go at its end, or (a SIGKILLed process counted a moment longer, seen on a
    # busy machine) at a later sweep; then nothing is left to sweep
    last, deadline = JobRunner(tmp_path / "node", cgroups=JobCgroups(REAL)), asyncio.get_running_loop().time() + 30
    while any((base / name).exists() for _, base in REAL.hierarchies for name in ("gone", "kept")):
        assert asyncio.get_running_loop().time() < deadline, "the stopped job's cgroups were never removed"
        last.sweep_cgroups()
        await asyncio.sleep(0.05)
    assert last.sweep_cgroups() == 0


@pytest.mark.parametrize("isolation, shown", [
    ({}, "unknown"),
    ({"cpu": "cgroup v1 cpu.cfs_quota_us", "memory": "cgroup v1 memory.limit_in_bytes",
      "devices": "not enforced: no NVIDIA device files on this node", "users": "not enforced: jobs run as the agent's user",
      "environment": "allowlist"}, "cpu,memory"),
    ({"cpu": "not enforced", "memory": "not enforced", "devices": "not enforced", "users": "not enforced"}, "none"),
])
def test_gpusched_nodes_shows_what_each_node_enforces(isolation, shown):
    from gpusched_cli.node_commands import enforced
    assert enforced(isolation) == shown
