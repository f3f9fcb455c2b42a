from __future__ import annotations

from pathlib import Path

import pytest

from gpusched_common import events as ev
from gpusched_common.schema_export import render_schemas
from services.cli.podspec import PodSpecError, spec_from_pod_yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_exported_schemas_match_the_models():
    rendered = render_schemas()
    on_disk = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    assert on_disk == rendered, "schemas/ drifted from the models: run `gpusched export-schemas`"


POD = """
apiVersion: v1
kind: Pod
metadata: {name: train, namespace: research}
spec:
  nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
  containers:
    - name: main
      image: trainer:1
      command: [python, train.py]
      args: [--epochs, "3"]
      env: [{name: SEED, value: "7"}]
      resources: {limits: {nvidia.com/gpu: 2}}
"""


def test_a_pod_spec_becomes_a_job_spec():
    spec = spec_from_pod_yaml(POD)
    assert (spec.tenant, spec.gpus, spec.gpu_model) == ("research", 2, "NVIDIA-A100-SXM4-80GB")
    assert spec.command == ["python", "train.py", "--epochs", "3"]
    assert spec.env == {"SEED": "7"}


def test_the_tenant_flag_overrides_the_namespace():
    assert spec_from_pod_yaml(POD, tenant="other").tenant == "other"


@pytest.mark.parametrize("text", ["- a list", "spec: {containers: []}", "kind: Pod\nspec: {containers: [{name: x}]}"])
def test_bad_pod_specs_give_a_clear_error(text):
    with pytest.raises(PodSpecError):
        spec_from_pod_yaml(text, tenant="t")


def test_a_mig_resource_becomes_a_mig_slice():
    spec = spec_from_pod_yaml(POD.replace("nvidia.com/gpu: 2", "nvidia.com/mig-3g.40gb: 1"))
    assert (spec.gpus, spec.mig_profile, spec.kind) == (1, "3g.40gb", "mig")


def test_annotations_ask_for_a_gang_or_a_share():
    gang = spec_from_pod_yaml(POD.replace("namespace: research}", "namespace: research,"
                                          " annotations: {gpusched.io/gang-nodes: '4'}}"))
    assert (gang.nodes, gang.gpus, gang.kind, gang.whole_gpus) == (4, 2, "gang", 8)
    share = spec_from_pod_yaml(POD.replace("{limits: {nvidia.com/gpu: 2}}", "{}").replace(
        "namespace: research}", "namespace: research, annotations: {gpusched.io/gpu-share-milli: '250',"
                                " gpusched.io/gpu-memory-mib: '8192'}}"))
    assert share.gpu_share == ev.GpuShareSpec(milli=250, memory_mib=8192) and share.gpus == 1


def test_a_pod_asking_for_mig_and_whole_gpus_is_refused():
    with pytest.raises(PodSpecError, match="one MIG slice or whole GPUs"):
        spec_from_pod_yaml(POD.replace("nvidia.com/gpu: 2", "nvidia.com/gpu: 2, nvidia.com/mig-1g.10gb: 1"))
