from __future__ import annotations

from pathlib import Path

import pytest

from gpusched_common import events as ev
from gpusched_common.schema_export import render_schemas
from gpusched_cli.main import main
from gpusched_cli.ops_commands import SCHEMAS_DIR
from gpusched_core.podspec import PodSpecError, cpu_milli, memory_mib, spec_from_pod_yaml

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_exported_schemas_match_the_models():
    rendered = render_schemas()
    on_disk = {p.name: p.read_text() for p in SCHEMAS.glob("*.json")}
    assert on_disk == rendered, "schemas/ drifted from the models: run `gpusched export-schemas`"


def test_export_schemas_writes_to_the_repository_s_schemas_by_default(capsys):
    assert SCHEMAS_DIR == SCHEMAS
    assert main(["export-schemas", "--check"]) == 0
    assert capsys.readouterr().out == "schemas up to date\n"


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


def test_host_cpu_and_memory_requests_are_summed_over_the_containers():
    text = POD.replace("resources: {limits: {nvidia.com/gpu: 2}}",
                       "resources: {limits: {nvidia.com/gpu: 2, cpu: '16', memory: 128Gi},"
                       " requests: {cpu: 7500m, memory: 64Gi}}\n"
                       "    - name: sidecar\n      image: log:1\n      resources: {limits: {cpu: 0.5, memory: 1G}}")
    spec = spec_from_pod_yaml(text)
    assert (spec.cpu_milli, spec.memory_mib) == (8_000, 64 * 1024 + 954)  # requests first; 1G = 953.67 MiB
    assert (spec_from_pod_yaml(POD).cpu_milli, spec_from_pod_yaml(POD).memory_mib) == (0, 0)


@pytest.mark.parametrize("quantity,milli", [("2", 2000), (2, 2000), ("1.5", 1500), ("500m", 500), ("0.0001", 1)])
def test_cpu_quantities(quantity, milli):
    assert cpu_milli(quantity) == milli


@pytest.mark.parametrize("quantity,mib", [("64Gi", 65536), ("512Mi", 512), ("1Ti", 1024 * 1024), ("1048576", 1),
                                          ("1", 1), ("2k", 1), ("1.5Gi", 1536)])
def test_memory_quantities(quantity, mib):
    assert memory_mib(quantity) == mib


@pytest.mark.parametrize("parse,quantity,reason", [
    (cpu_milli, "2 cores", "not a quantity"), (cpu_milli, "-1", "no sign"), (cpu_milli, "1e", "not a quantity"),
    (memory_mib, "64GB", "not a quantity"), (memory_mib, "lots", "not a quantity"), (memory_mib, True, "a boolean")])
def test_bad_quantities_say_what_is_expected(parse, quantity, reason):
    with pytest.raises(PodSpecError, match=reason):
        parse(quantity)
