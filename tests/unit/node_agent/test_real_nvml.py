"""Real NVML: run on a machine with an NVIDIA GPU and driver; skipped (with the reason) elsewhere."""

from __future__ import annotations

import pytest

from services.node_agent.real_nvml import NvmlUnavailable, RealNvml


@pytest.fixture(scope="module")
def nvml():
    try:
        backend = RealNvml()
    except NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA GPU on this machine, real-NVML tests need one ({exc})")
    yield backend
    backend.close()


def test_inventory_names_every_gpu_with_uuid_model_and_memory(nvml):
    info = nvml.node_info()
    assert info.gpus and info.backend == "nvml" and info.driver_version
    for index, gpu in enumerate(info.gpus):
        assert gpu.index == index and gpu.uuid.startswith("GPU-") and gpu.memory_mib > 0 and gpu.model
        for mig in gpu.mig_devices:
            assert mig.uuid.startswith("MIG-") and mig.memory_mib > 0


def test_samples_and_health_cover_every_gpu(nvml):
    count = len(nvml.node_info().gpus)
    samples = nvml.sample()
    assert [s.index for s in samples] == list(range(count))
    assert all(0.0 <= s.utilization_pct <= 100.0 and s.memory_total_mib > 0 for s in samples)
    health = nvml.health()
    assert [h.index for h in health] == list(range(count)) and all(h.reachable for h in health)


def test_faults_cannot_be_injected_into_real_gpus(nvml):
    from services.node_agent.faults import Fault

    with pytest.raises(ValueError):
        nvml.inject(Fault("xid", 0, 79))
