from __future__ import annotations

from pathlib import Path

import pytest

from gpusched_core.quota import (
    UNITS_PER_GPU,
    GpuAsk,
    TenancyError,
    UnitError,
    format_gpus,
    gpu_equivalents,
    load_tenancy,
    quota_ask,
    units_for,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "tenants.example.yaml"


def test_the_example_file_loads_with_its_tree_and_inherited_priority_classes():
    tenancy = load_tenancy(EXAMPLE.read_text())
    assert tenancy.leaves() == ("team-a", "team-b", "inference", "infra")
    assert tenancy.tenants["team-a"].parent == "research"
    assert tenancy.root_of("infra") == "acme"
    assert tenancy.tenants["infra"].priority_classes == frozenset({"production", "batch"})  # from platform
    assert tenancy.nominal_units("team-a", "A100-80GB") == 16 * UNITS_PER_GPU
    assert tenancy.gpu_equivalents["H100-80GB"] == 2.0
    assert (tenancy.version, tenancy.revision, tenancy.half_life_s) == (1, 1, 604800)


def test_every_problem_is_reported_at_once_with_its_place():
    text = """
version: 1
priority_classes: {batch: 1}
default_priority_class: urgent
tenants:
  - name: org
    quota: {A100: {nominal: 4}}
    children:
      - name: team-a
        priority_classes: [gold]
        quota: {A100: {nominal: 8, lending_limit: 9}}
      - name: team-a
"""
    with pytest.raises(TenancyError) as caught:
        load_tenancy(text)
    problems = caught.value.problems
    assert len(problems) == 5
    assert any("default_priority_class: 'urgent' is not a priority class" in p for p in problems)
    assert any("tenants[0] (org): quota A100: an organisation has no nominal quota" in p for p in problems)
    assert any("tenants[0].children[0] (team-a): unknown priority classes gold" in p for p in problems)
    assert any("lending_limit 9 exceeds nominal 8" in p for p in problems)
    assert any("tenants[0].children[1] (team-a): tenant name is used twice" in p for p in problems)
    assert "tenancy file is invalid (5 problems)" in str(caught.value)


@pytest.mark.parametrize("text, fragment", [
    ("version: 2\ntenants: [{name: a}]", "version: 2 is not supported"),
    ("version: 1\ntenants: []", "tenants: List should have at least 1 item"),
    ("version: 1\ntenants: [{name: a, wieght: 2}]", "tenants[0].wieght: Extra inputs are not permitted"),
    ("version: 1\ntenants: [{name: a, weight: 0}]", "tenants[0].weight: Input should be greater than 0"),
    ("version: [1\n", "not valid YAML"),
    ("- 1\n", "must be a mapping"),
], ids=["future-version", "no-tenants", "typo", "zero-weight", "bad-yaml", "not-a-mapping"])
def test_invalid_files_are_rejected_with_a_clear_message(text, fragment):
    with pytest.raises(TenancyError) as caught:
        load_tenancy(text)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("ask, model, units", [
    (GpuAsk(gpus=2), "A100", 2 * UNITS_PER_GPU),
    (GpuAsk(share_milli=250), "A100", UNITS_PER_GPU // 4),
    (GpuAsk(mig_profile="3g.40gb"), "A100", 3 * UNITS_PER_GPU // 7),
    (GpuAsk(mig_profile="1g.6gb"), "A30", UNITS_PER_GPU // 4),
], ids=["whole", "share", "mig-7-slices", "mig-4-slices"])
def test_whole_gpus_shares_and_mig_slices_are_exact_units(ask, model, units):
    assert units_for(ask, model, {"A30": 4}) == units


def test_a_request_must_ask_for_exactly_one_kind_and_a_known_mig_shape():
    with pytest.raises(UnitError):
        units_for(GpuAsk(gpus=1, share_milli=100), "A100", {})
    with pytest.raises(UnitError):
        units_for(GpuAsk(mig_profile="big"), "A100", {})


def test_normalised_usage_follows_configured_gpu_equivalents():
    assert gpu_equivalents(2 * UNITS_PER_GPU, "H100", {"H100": 2.0}) == 4.0
    assert gpu_equivalents(UNITS_PER_GPU // 2, "T4", {}) == 0.5
    assert quota_ask(GpuAsk(gpus=1), ("H100", "A100"), {}).options == (("H100", 7000), ("A100", 7000))
    assert format_gpus(16 * UNITS_PER_GPU) == "16" and format_gpus(UNITS_PER_GPU // 2) == "0.5"
