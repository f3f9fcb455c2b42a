"""What an agent labels its node with: GPU feature discovery's names, from the inventory; the operator's win."""

from __future__ import annotations

import pytest

from gpusched_common.events import GpuInventory
from gpusched_core.agent.labels import discovered_labels, node_labels, product_label
from gpusched_core.submission import is_label_value


def _gpus(model: str, memory_mib: int, count: int, product: str | None = None) -> list[GpuInventory]:
    return [GpuInventory(index=i, uuid=f"GPU-{i}", model=model, memory_mib=memory_mib, product=product)
            for i in range(count)]


def test_a_node_of_h100s_is_labelled_as_gpu_feature_discovery_would():
    labels = discovered_labels(_gpus("H100-80GB", 81559, 8, "NVIDIA H100 80GB HBM3"), "550.54.15", "12.4")
    assert labels == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4"}


def test_without_gpus_or_versions_nothing_is_made_up():
    assert discovered_labels([], "550.54.15", "12.4") == {}
    labels = discovered_labels(_gpus("L4-24GB", 23034, 1), None, "unknown")
    assert labels["nvidia.com/mig.capable"] == "false" and labels["nvidia.com/gpu.product"] == "L4-24GB"
    assert not any(k.startswith("nvidia.com/cuda.") for k in labels)


def test_the_operator_s_labels_win():
    assert node_labels({"nvidia.com/gpu.present": "true", "zone": "a"}, {"zone": "b"}) == {
        "nvidia.com/gpu.present": "true", "zone": "b"}


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 NVL",
                                  "Tesla V100-SXM2-32GB", "NVIDIA GH200 480GB", " weird / name (rev 2) ", "x" * 100])
def test_every_product_label_is_a_valid_label_value(name):
    assert is_label_value(product_label(name))
