"""Simulated inventory (models, MIG layouts), NVLink domains, labels, faults and the share environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.node_agent.faults import Fault, due_faults, parse_faults, partitioned
from gpusched_core.placement.mig import mig_profile_name
from services.node_agent.inventory import nvlink_domains, parse_labels
from services.node_agent.shares import job_environment
from services.node_agent.simulated import SimulatedNvml, mig_layout, parse_gpu_spec


def test_gpu_spec_with_models_counts_and_a_mig_layout():
    groups = parse_gpu_spec("A100-80GB:2:mig=3g.40gb+2g.20gb+1g.10gb, L4-24GB:1")
    assert [(g.model, g.count, g.mig_profiles) for g in groups] == [
        ("A100-80GB", 2, ("3g.40gb", "2g.20gb", "1g.10gb")), ("L4-24GB", 1, ())]


@pytest.mark.parametrize("spec, error", [
    ("B9000:8", "unknown GPU model"),
    ("H100-80GB:0", "outside 1..16"),
    ("L4-24GB:1:mig=1g.6gb", "does not support MIG"),
    ("H100-80GB:1:mig=4g.40gb+4g.40gb", "compute slices"),
    ("A100-80GB:1:mig=7g.80gb+1g.10gb", "compute slices"),
])
def test_bad_gpu_specs_are_refused_with_a_reason(spec, error):
    with pytest.raises(ValueError, match=error):
        parse_gpu_spec(spec)


def test_mig_devices_get_disjoint_memory_slices():
    layout = mig_layout("H100-80GB", ("1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb"))
    used = set()
    for _, start, slices in layout:
        span = set(range(start, start + slices))
        assert not span & used
        used |= span
    assert layout[0] == ("3g.40gb", 0, 4)


def test_simulated_inventory_has_mig_devices_uuids_and_nvlink_peers():
    info = SimulatedNvml("n1", "A100-80GB:1:mig=3g.40gb+3g.40gb,A100-80GB:1").node_info()
    first, second = info.gpus
    assert first.mig_enabled and [d.profile for d in first.mig_devices] == ["3g.40gb", "3g.40gb"]
    assert all(d.uuid.startswith("MIG-") for d in first.mig_devices)
    assert not second.mig_enabled and second.nvlink_peers == [0]
    assert info.backend == "simulated" and info.cuda_version


def test_simulated_utilization_and_memory_follow_the_jobs_it_runs():
    nvml = SimulatedNvml("n1", "H100-80GB:2")
    idle = nvml.sample()
    assert [s.utilization_pct for s in idle] == [0.0, 0.0]
    nvml.attach("j1", (1,), pid=4242, share_milli=500, memory_mib=2048)
    busy = nvml.sample()[1]
    assert 40.0 <= busy.utilization_pct <= 50.0
    assert busy.memory_used_mib == 2048 and [p.pid for p in busy.processes] == [4242]
    nvml.detach("j1")
    assert nvml.sample()[1].utilization_pct == 0.0


def test_injected_faults_show_in_health_and_samples():
    nvml = SimulatedNvml("n1", "H100-80GB:2")
    nvml.inject(Fault("xid", 0, 48))
    nvml.inject(Fault("thermal", 1))
    health = nvml.health()
    assert health[0].xids == (48,) and nvml.health()[0].xids == ()  # drained once
    assert "hw_thermal_slowdown" in health[1].throttle_reasons
    assert nvml.sample()[1].temperature_c >= 90
    nvml.inject(Fault("offbus", 1))
    assert not nvml.health()[1].reachable and not nvml.sample()[1].healthy


def test_nvlink_domains_are_connected_components_or_one_switch():
    assert nvlink_domains("n", {0: [1], 1: [0], 2: [3], 3: [2], 4: []}) == {
        0: "n/nvlink-0", 1: "n/nvlink-0", 2: "n/nvlink-2", 3: "n/nvlink-2"}
    assert set(nvlink_domains("n", {0: [], 1: []}, switched=True).values()) == {"n/nvswitch-0"}


def test_mig_profile_names_and_labels():
    assert mig_profile_name(3, 40192, "A100-80GB") == "3g.40gb"
    assert mig_profile_name(7, 80896, "H100-80GB") == "7g.80gb"
    assert mig_profile_name(1, 4864) == "1g.5gb"
    assert parse_labels("rack=r1, gpusched.io/pool=train") == {"rack": "r1", "gpusched.io/pool": "train"}
    with pytest.raises(ValueError):
        parse_labels("rack")


def test_fault_lists_parse_schedule_and_expand_throttle_durations():
    faults = parse_faults("xid:3:79@30s, thermal:2@10s+5s, partition@1s+2s")
    assert faults[0] == Fault("xid", 3, 79, 30.0)
    assert Fault("clear", 2, None, 15.0) in faults
    assert due_faults(faults, frozenset(), 12.0) == (1, 3)
    assert partitioned(faults, 2.0) and not partitioned(faults, 3.5)
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("meltdown:1")
    with pytest.raises(ValueError, match="XID code"):
        parse_faults("xid:1")


def test_a_fractional_share_sets_mps_limits_and_says_what_it_could_not_enforce():
    env = job_environment(gpu_indices=(2,), gpu_uuids=("GPU-x",), share_milli=250, memory_mib=10240, mps_pipe_dir=None)
    assert env.env["CUDA_VISIBLE_DEVICES"] == "2"
    assert env.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert len(env.unenforced) == 2
    enforced = job_environment(gpu_indices=(2,), gpu_uuids=(), share_milli=250, memory_mib=None,
                               mps_pipe_dir=Path("/tmp/mps"))
    assert enforced.unenforced == () and enforced.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps"


def test_mig_devices_are_made_visible_by_uuid_and_whole_gpus_by_index():
    assert job_environment(gpu_indices=(0,), gpu_uuids=("MIG-abc",), share_milli=None, memory_mib=None,
                           mps_pipe_dir=None).env["CUDA_VISIBLE_DEVICES"] == "MIG-abc"
    whole = job_environment(gpu_indices=(0, 1), gpu_uuids=("GPU-a", "GPU-b"), share_milli=1000, memory_mib=None,
                            mps_pipe_dir=None)
    assert whole.env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and whole.unenforced == ()


def test_a_mig_mode_gpu_creates_instances_where_placement_put_them():
    backend = SimulatedNvml("n1", "A100-80GB:1:mig")
    assert backend.node_info().gpus[0].mig_enabled and backend.node_info().gpus[0].mig_devices == []
    three = backend.mig_device_for("a", 0, "3g.40gb", 4)
    two = backend.mig_device_for("b", 0, "2g.20gb", 0)
    devices = backend.node_info().gpus[0].mig_devices
    assert [(d.profile, d.start_slice, d.uuid) for d in devices] == [("2g.20gb", 0, two), ("3g.40gb", 4, three)]
    assert three.startswith("MIG-") and backend.mig_device_for("a", 0, "3g.40gb", 4) == three  # a repeat: same


def test_a_running_mig_instance_is_never_taken_over_and_an_idle_one_is_reused_or_replaced():
    backend = SimulatedNvml("n1", "A100-80GB:1:mig=3g.40gb+3g.40gb")
    fixed = {d.start_slice: d.uuid for d in backend.node_info().gpus[0].mig_devices}
    assert backend.mig_device_for("a", 0, "3g.40gb", 0) == fixed[0]  # the existing instance
    with pytest.raises(ValueError, match="held by a running MIG instance"):
        backend.mig_device_for("b", 0, "1g.10gb", 1)
    backend.detach("a")
    one = backend.mig_device_for("b", 0, "1g.10gb", 1)  # idle now: replaced by what placement chose
    assert one not in fixed.values()
    assert [d.profile for d in backend.node_info().gpus[0].mig_devices] == ["1g.10gb", "3g.40gb"]


def test_mig_is_refused_on_a_gpu_not_in_mig_mode():
    with pytest.raises(ValueError, match="not in MIG mode"):
        SimulatedNvml("n1", "A100-80GB:1").mig_device_for("a", 0, "1g.10gb", 0)
    with pytest.raises(ValueError, match="does not support MIG"):
        parse_gpu_spec("L4-24GB:1:mig")
