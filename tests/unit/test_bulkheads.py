"""What a node may tell the control plane: registrations that cannot describe a real node, and heartbeats
or reports with numbers out of range, are refused with every reason."""

from __future__ import annotations

import pytest

from gpusched_common import events as ev
from gpusched_core.bulkheads import check_heartbeat, check_registration, check_report
from tests.builders import T0


def node(**changes) -> ev.NodeRegistered:
    base = ev.NodeRegistered(node_id="n1", hostname="n1", cpu_milli=64_000, memory_mib=512_000, nvml_backend="real",
                             lease_epoch=3, gpus=[ev.GpuInventory(index=i, uuid=f"GPU-{i}", model="H100-80GB",
                                                                  memory_mib=81559) for i in range(4)])
    return base.model_copy(update=changes)


def gpus(*changes: dict) -> list[ev.GpuInventory]:
    return [g.model_copy(update=c) for g, c in zip(node().gpus, changes, strict=False)]


def test_a_real_node_passes():
    assert check_registration(node()) == []
    assert check_heartbeat(ev.NodeHeartbeat(node_id="n1", running_jobs=["j1"], lease_epoch=3, lease_ttl_s=30,
                                            fence_grace_s=10)) == []


@pytest.mark.parametrize("changes, says", [
    ({"gpus": gpus({}, {"index": 5}, {}, {})}, "are not 0..3"),
    ({"gpus": gpus({}, {"index": 0}, {}, {})}, "are not 0..3"),
    ({"gpus": gpus({"uuid": "X"}, {"uuid": "X"}, {}, {})}, "distinct"),
    ({"gpus": gpus({"memory_mib": 0}, {}, {}, {})}, "memory_mib 0"),
    ({"gpus": gpus({"nvlink_peers": [0]}, {}, {}, {})}, "NVLink peers"),
    ({"gpus": gpus({"nvlink_peers": [9]}, {}, {}, {})}, "NVLink peers"),
    ({"gpus": [ev.GpuInventory(index=i, uuid=str(i), model="H100-80GB", memory_mib=1) for i in range(65)]}, "at most 64"),
    ({"lease_epoch": -1}, "lease epoch"),
    ({"lease_epoch": 2**63}, "lease epoch"),
    ({"cpu_milli": -1}, "cpu_milli"),
    ({"memory_mib": 10**15}, "memory_mib"),
    ({"hostname": ""}, "hostname"),
    ({"node_id": "bad id"}, "not a valid id"),
    ({"labels": {f"k{i}": "v" for i in range(100)}}, "labels"),
    ({"log_url": "file:///etc/passwd"}, "log_url"),
    ({"running_jobs": ["ok", "not valid"]}, "running_jobs"),
])
def test_an_impossible_registration_says_why(changes, says):
    assert any(says in reason for reason in check_registration(node(**changes))), check_registration(node(**changes))


@pytest.mark.parametrize("changes, says", [
    ({"lease_ttl_s": 1e14}, "lease_ttl_s"), ({"lease_ttl_s": float("nan")}, "lease_ttl_s"),
    ({"fence_grace_s": -1}, "fence_grace_s"), ({"lease_epoch": -2}, "lease epoch"),
    ({"unhealthy_gpus": [99]}, "unhealthy_gpus"),
])
def test_a_heartbeat_out_of_range_says_why(changes, says):
    beat = ev.NodeHeartbeat(node_id="n1", running_jobs=[], lease_epoch=1, lease_ttl_s=30, fence_grace_s=10)
    assert any(says in r for r in check_heartbeat(beat.model_copy(update=changes)))


@pytest.mark.parametrize("report, says", [
    (ev.JobStartReported(job_id="j", node_id="n1", pid=-1, started_at=T0), "pid"),
    (ev.JobExitReported(job_id="j", node_id="n1", exit_code=2**40, runtime_s=1), "exit code"),
    (ev.JobExitReported(job_id="j", node_id="n1", exit_code=0, runtime_s=float("inf")), "runtime_s"),
    (ev.JobExitReported(job_id="j", node_id="n1", exit_code=0, runtime_s=1, lease_epoch=-1), "lease epoch"),
    (ev.JobCheckpointReported(job_id="j", node_id="n1", checkpoint_ref="x" * 2000, checkpointed_at=T0), "1024"),
])
def test_a_report_out_of_range_says_why(report, says):
    assert any(says in r for r in check_report(report))
    assert check_report(ev.JobExitReported(job_id="j", node_id="n1", exit_code=137, runtime_s=3.5)) == []
