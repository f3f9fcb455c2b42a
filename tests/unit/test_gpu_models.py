"""GPU model names by rule (``gpusched_common.resources``), the operator's catalogue and the resolution of
a requested model against the cluster's (``gpusched_core.gpu_models``), and admission's decision with
the cluster's models (``parse_submission`` with a ``ModelView``)."""

from __future__ import annotations

import pytest

from gpusched_common.gpu_catalogue import read_catalogue
from gpusched_common.resources import canonical_model, memory_class_gb, parse_gpu_name
from gpusched_core.gpu_models import Catalogue, CatalogueError, ModelView, Refusal, load_catalogue
from gpusched_core.placement.mig import mig_family, mig_profile_name
from services.admission.core import AdmissionLimits, parse_submission
from gpusched_cli.client import submission_bytes
from tests.builders import T0, a_job

# (what NVML or GPU feature discovery says, the memory NVML reports (None: no inventory), canonical model)
NAMES = [
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", 40536, "A100-PCIE-40GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100-PCIE-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-PCIE-80GB"),
    ("NVIDIA H100 NVL", 95830, "H100-NVL-94GB"),
    ("NVIDIA H100 NVL", None, "H100-NVL"),
    ("NVIDIA H200", 143771, "H200-141GB"),
    ("NVIDIA H200 NVL", 143771, "H200-NVL-141GB"),
    ("NVIDIA GH200 480GB", 97871, "GH200-96GB"),
    ("NVIDIA GH200 480GB", None, "GH200"),
    ("NVIDIA GH200 144G HBM3e", None, "GH200-144GB"),
    ("NVIDIA B200", 183359, "B200-180GB"),
    ("NVIDIA B200", None, "B200"),
    ("NVIDIA GB200", 189471, "GB200-186GB"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090-24GB"),
    ("NVIDIA GeForce RTX 3080 Ti", 12288, "RTX-3080-TI-12GB"),
    ("NVIDIA RTX A6000", 49140, "RTX-A6000-48GB"),
    ("NVIDIA RTX 6000 Ada Generation", 49140, "RTX-6000-ADA-48GB"),
    ("Quadro RTX 8000", 49152, "RTX-8000-48GB"),
    ("Tesla V100-SXM2-16GB", 16160, "V100-16GB"),
    ("Tesla V100-SXM2-32GB", 32510, "V100-32GB"),
    ("Tesla V100-PCIE-32GB", 32510, "V100-PCIE-32GB"),
    ("Tesla T4", 15360, "T4-16GB"),
    ("NVIDIA L40S", 46068, "L40S-48GB"),
    ("NVIDIA L4", 23034, "L4-24GB"),
    ("NVIDIA A10G", 23028, "A10G-24GB"),
    ("Tesla P4", 7611, "P4-8GB"),
    # GPU feature discovery's nvidia.com/gpu.product values
    ("NVIDIA-H100-80GB-HBM3", None, "H100-80GB"),
    ("NVIDIA-A100-SXM4-80GB", None, "A100-80GB"),
    ("NVIDIA-A100-80GB-HBM2e", None, "A100-80GB"),
    ("NVIDIA-A100-PCIE-40GB", None, "A100-PCIE-40GB"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", None, "A100-40GB"),
    ("A100-SXM4-40GB-MIG-1c.2g.10gb", None, "A100-40GB"),
    ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb-SHARED", None, "H100-80GB"),
    ("NVIDIA-L40S-SHARED", None, "L40S"),
    ("NVIDIA-GeForce-RTX-4090", None, "RTX-4090"),
    ("NVIDIA-GH200-480GB", None, "GH200"),
    ("Tesla-T4", None, "T4"),
    # canonical names stay what they are (stored events, tenancies, traces)
    *[(name, None, name) for name in ("H100-80GB", "A100-80GB", "A100-40GB", "H200-141GB", "L40S-48GB", "L4-24GB",
                                      "T4-16GB", "V100-32GB", "H100-NVL-94GB", "B200-180GB", "RTX-4090-24GB")],
]


@pytest.mark.parametrize(("name", "memory_mib", "model"), NAMES, ids=lambda v: str(v))
def test_product_names_and_labels_normalise_to_one_canonical_model(name, memory_mib, model):
    assert canonical_model(name, memory_mib) == model
    assert canonical_model(model, memory_mib) == model  # the rule is idempotent


@pytest.mark.parametrize("name", ["", "   ", "GPU", "NVIDIA", "Not a GPU", "H100/80GB", "x" * 101, "A100 (SXM4)"])
def test_what_is_no_gpu_model_name_has_no_canonical_model(name):
    assert canonical_model(name) is None


@pytest.mark.parametrize(("memory_mib", "gb"), [(81559, 80), (46068, 48), (23034, 24), (15360, 16), (143771, 141),
                                                (95830, 94), (97871, 96), (183359, 180), (40536, 40), (300 * 1024, 300)])
def test_reported_memory_snaps_to_the_class_gpus_are_sold_with(memory_mib, gb):
    assert memory_class_gb(memory_mib) == gb


def test_the_inventory_s_memory_wins_over_the_name_s():
    assert canonical_model("NVIDIA GH200 480GB", 97871) == "GH200-96GB"  # 480GB: the module's, not the GPU's
    assert parse_gpu_name("NVIDIA A100 80GB PCIe").kind == ("A100", "PCIE")


@pytest.mark.parametrize(("model", "family"), [("H100-PCIE-80GB", "H100-80GB"), ("A100-PCIE-40GB", "A100-40GB"),
                                               ("H100-NVL-94GB", "H100-NVL-94GB"), ("GH200-96GB", "GH200-96GB"),
                                               ("B200-180GB", "B200-180GB"), ("H200-141GB", "H200-141GB"),
                                               ("GH200-144GB", None), ("L40S-48GB", None), ("RTX-4090-24GB", None)])
def test_mig_families_by_rule(model, family):
    assert mig_family(model) == family


def test_mig_instances_of_new_families_are_named_as_nvidia_does():
    assert mig_profile_name(3, 47 * 1024 - 300, "H100-NVL-94GB") == "3g.47gb"
    assert mig_profile_name(7, 180 * 1024 - 900, "B200-180GB") == "7g.180gb"
    assert mig_profile_name(1, 18 * 1024 - 200, "H200-141GB") == "1g.18gb"


GOOD = """
models:
  - name: A100-80GB
    display: NVIDIA A100 80GB SXM4
    aliases: [NVIDIA-A100-80GB-HBM2e, site-a100]
  - name: B200-180GB
    display: NVIDIA B200 (Blackwell)
"""


def test_a_catalogue_gives_aliases_and_display_names():
    catalogue = load_catalogue(GOOD)
    assert catalogue.canonical("site-a100") == "A100-80GB"
    assert catalogue.canonical("SITE_A100") == "A100-80GB"
    assert catalogue.canonical("NVIDIA-A100-80GB-HBM2e-SHARED") == "A100-80GB"
    assert catalogue.canonical("NVIDIA L40S", 46068) == "L40S-48GB"  # the rule for what it does not name
    assert catalogue.display("B200-180GB") == "NVIDIA B200 (Blackwell)"
    assert load_catalogue("") == Catalogue()


@pytest.mark.parametrize(("text", "problem"), [
    ("models: [", "is not YAML"),
    ("- a", "must be a mapping with one key, models"),
    ("models: {a: 1}", "models must be a list"),
    ("models: [H100-80GB]", "models[1]: a model is a mapping of name, display and aliases"),
    ("models: [{name: NVIDIA H100 80GB HBM3}]", "models[1]: name 'NVIDIA H100 80GB HBM3' is not canonical: write 'H100-80GB'"),
    ("models: [{name: B200}]", "models[1]: name 'B200' has no memory class: write it with one, e.g. B200-80GB"),
    ("models: [{name: 'Not a GPU'}]", "models[1]: 'Not a GPU' is no GPU model name"),
    ("models: [{name: H100-80GB, vram: 80}]", "models[1]: unknown field(s) vram"),
    ("models: [{name: H100-80GB, aliases: x}]", "models[1]: aliases must be a list of names"),
    ("models: [{name: H100-80GB, display: ''}]", "models[1]: display must be text of 1..80 characters"),
    ("models: [{name: H100-80GB}, {name: H100-80GB}]", "models[2]: H100-80GB is described twice"),
    ("models: [{name: H100-80GB, aliases: [fast]}, {name: A100-80GB, aliases: [Fast]}]",
     "models[2]: alias 'Fast' is already H100-80GB's"),
])
def test_a_bad_catalogue_is_refused_with_every_problem_named(text, problem):
    with pytest.raises(CatalogueError) as refused:
        load_catalogue(text, "catalogue.yaml")
    assert any(problem in p for p in refused.value.problems), refused.value.problems
    assert str(refused.value).startswith("GPU catalogue catalogue.yaml: ")


def test_the_catalogue_file_is_read_by_the_shell(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(GOOD)
    assert read_catalogue(path).canonical("site-a100") == "A100-80GB"
    assert read_catalogue(None) == Catalogue()
    with pytest.raises(CatalogueError, match="cannot be read"):
        read_catalogue(tmp_path / "missing.yaml")


CLUSTER = ModelView({"B200-180GB": 183359, "H100-80GB": 81559, "L40S-48GB": 46068}, ("A100-80GB",),
                    load_catalogue(GOOD))


@pytest.mark.parametrize(("requested", "model"), [
    ("NVIDIA-B200", "B200-180GB"), ("NVIDIA B200", "B200-180GB"), ("B200-180GB", "B200-180GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"), ("H100", "H100-80GB"), ("NVIDIA-L40S-SHARED", "L40S-48GB"),
    ("site-a100", "A100-80GB"), ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),  # declared: no node has it yet
])
def test_a_model_resolves_to_the_one_the_cluster_has(requested, model):
    assert CLUSTER.resolve(requested) == model


def test_a_model_no_node_has_is_refused_with_the_cluster_s_models():
    refused = CLUSTER.resolve("NVIDIA GH200 480GB")
    assert refused == Refusal("unknown GPU model 'NVIDIA GH200 480GB': no registered node has GH200 (the cluster has: "
                              "A100-80GB (NVIDIA A100 80GB SXM4), B200-180GB (NVIDIA B200 (Blackwell)), H100-80GB, "
                              "L40S-48GB)")
    assert isinstance(CLUSTER.resolve("A100-PCIE-40GB"), Refusal)  # the form factor and memory matter
    assert ModelView().resolve("H100-80GB") == Refusal(
        "unknown GPU model 'H100-80GB': no registered node has H100-80GB (no node has registered a GPU yet)")


def test_a_name_without_memory_two_models_could_be_is_ambiguous():
    view = ModelView({"A100-40GB": 40536, "A100-80GB": 81920})
    assert view.resolve("NVIDIA-A100") == Refusal("GPU model 'NVIDIA-A100' is ambiguous here: name one of A100-40GB, "
                                                  "A100-80GB")
    assert view.resolve("NVIDIA-A100-SXM4-40GB") == "A100-40GB"


def test_an_old_agent_s_spelling_is_matched_by_its_memory():
    assert ModelView({"NVIDIA-B200": 183359}).resolve("B200-180GB") == "NVIDIA-B200"


def raw(builder, job_id: str = "j1") -> bytes:
    return submission_bytes(builder.spec(), job_id, now=T0)


def test_admission_admits_a_model_only_a_registered_node_has_and_names_it_as_the_cluster_does():
    sub = parse_submission(raw(a_job("j1").gpus(8).model("NVIDIA-B200")), AdmissionLimits(), CLUSTER)
    assert sub.reasons == () and sub.spec is not None and sub.spec.gpu_model == "B200-180GB"


def test_admission_refuses_a_model_no_node_has_with_the_cluster_s_list_and_every_other_reason():
    sub = parse_submission(raw(a_job("j1").gpus(0).model("NVIDIA RTX A6000")), AdmissionLimits(), CLUSTER)
    assert sub.spec is None
    assert sub.reasons == ("gpus must be at least 1, got 0",
                           "unknown GPU model 'NVIDIA RTX A6000': no registered node has RTX-A6000 (the cluster has: "
                           "A100-80GB (NVIDIA A100 80GB SXM4), B200-180GB (NVIDIA B200 (Blackwell)), H100-80GB, "
                           "L40S-48GB)")


@pytest.mark.parametrize(("job", "reason"), [
    (a_job("j").share(500, 50_000).model("NVIDIA-L40S"), "gpu_share.memory_mib 50000 is outside 0..46068"),
    (a_job("j").share(500, 190_000), "gpu_share.memory_mib 190000 is outside 0..183359"),  # the largest GPU
    (a_job("j").mig("3g.40gb").model("NVIDIA B200"), "MIG profile '3g.40gb' does not exist on a B200-180GB (known: "
     "1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb)"),
    (a_job("j").mig("1g.10gb").model("L40S"), "MIG profile '1g.10gb' does not exist on a L40S-48GB: MIG is placed "
     "only on models whose MIG geometry is known"),
])
def test_shares_and_mig_are_bounded_by_the_cluster_s_inventory(job, reason):
    sub = parse_submission(raw(job), AdmissionLimits(), CLUSTER)
    assert any(r.startswith(reason) for r in sub.reasons), sub.reasons


def test_a_share_of_a_model_s_inventory_and_a_mig_slice_of_a_new_family_are_admitted():
    for job in (a_job("j").share(500, 46068).model("NVIDIA-L40S"), a_job("j").mig("3g.90gb").model("NVIDIA-B200")):
        sub = parse_submission(raw(job), AdmissionLimits(), CLUSTER)
        assert sub.reasons == ()


def test_a_simulated_node_reports_the_canonical_model_and_the_product_nvml_would_give():
    from services.node_agent.simulated import SimulatedNvml

    gpus = SimulatedNvml("n1", "NVIDIA H100 NVL:2:mem=95830:mig=3g.47gb+3g.47gb,L4-24GB:1").node_info().gpus
    assert [(g.model, g.product, g.memory_mib) for g in gpus] == [
        ("H100-NVL-94GB", "NVIDIA H100 NVL", 95830), ("H100-NVL-94GB", "NVIDIA H100 NVL", 95830),
        ("L4-24GB", "L4-24GB", 24576)]
    assert [d.profile for d in gpus[0].mig_devices] == ["3g.47gb", "3g.47gb"]


def test_a_simulated_product_without_a_memory_class_needs_its_memory():
    from services.node_agent.simulated import parse_gpu_spec

    with pytest.raises(ValueError, match=r"NVIDIA B200:8:mem=81920"):
        parse_gpu_spec("NVIDIA B200:8")
    assert parse_gpu_spec("NVIDIA B200:8:mem=183359")[0].model == "B200-180GB"


def test_a_real_node_reports_what_the_rule_makes_of_nvml_s_name():
    from services.node_agent.real_nvml import reported_model

    assert reported_model("NVIDIA GH200 480GB", 97871) == "GH200-96GB"
    assert reported_model("Some (odd) device", 1024) == "Some-(odd)-device"  # as GPU feature discovery spells it
