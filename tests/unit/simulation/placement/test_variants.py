"""Trace variants of the FGD paper's families, generated from a base pod list."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpusched_simulation.placement.cli import add_simulate_parser, run_simulate
from gpusched_simulation.placement.variants import (
    PUBLISHED_VARIANTS,
    SPEC_POOL,
    kind_of,
    make_variant,
    parse_variant,
)
from gpusched_simulation.traces.openb import TracePod, default_pods_path, load_pods

needs_traces = pytest.mark.skipif(not default_pods_path().is_file(), reason="shared openb traces not present")


@pytest.fixture(scope="module")
def default_pods() -> list[TracePod]:
    return load_pods(default_pods_path())


def share_of_gpu(pods: list[TracePod], predicate) -> float:  # noqa: ANN001
    return 100.0 * sum(p.gpu_milli for p in pods if predicate(p)) / sum(p.gpu_milli for p in pods)


@pytest.mark.parametrize(("name", "family", "level"), [("gpuspec25", "gpuspec", 25.0), ("cpu050", "cpu", 5.0),
                                                       ("cpu250", "cpu", 25.0), ("gpushare100", "gpushare", 100.0),
                                                       ("multigpu30", "multigpu", 30.0)])  # fmt: skip
def test_names_parse_to_a_family_and_a_level(name: str, family: str, level: float) -> None:
    variant = parse_variant(name)
    assert variant is not None and (variant.family, variant.level_pct) == (family, level)
    assert variant.name == name


def test_default_is_the_base_and_unknown_names_are_refused() -> None:
    assert parse_variant("default") is None
    for bad in ("gpuspec", "spec25", "gpuspec101"):
        with pytest.raises(ValueError):
            parse_variant(bad)


@needs_traces
def test_default_and_level_zero_leave_the_trace_unchanged(default_pods: list[TracePod]) -> None:
    assert make_variant(default_pods, "default") == default_pods
    assert make_variant(default_pods, "gpuspec0") == default_pods


@needs_traces
@pytest.mark.parametrize("level", [10, 25, 33, 50])
def test_gpuspec_pins_the_share_of_gpu_asked_for_and_changes_nothing_else(default_pods, level: int) -> None:  # noqa: ANN001
    pods = make_variant(default_pods, f"gpuspec{level}", seed=3)
    assert share_of_gpu(pods, lambda p: p.request.allowed_models) == pytest.approx(level, abs=0.2)
    gpu_pods = [p for p in pods if p.gpu_milli > 0]
    pinned_pods = sum(1 for p in gpu_pods if p.request.allowed_models)
    assert 100.0 * pinned_pods / len(gpu_pods) == pytest.approx(level, abs=2.0)  # pods of every size alike
    assert not any(p.request.allowed_models for p in pods if p.gpu_milli == 0)
    unpinned = [(p.request.id, p.request.gpu, p.request.cpu_milli) for p in pods]
    assert unpinned == [(p.request.id, p.request.gpu, p.request.cpu_milli) for p in default_pods]


@needs_traces
def test_gpuspec_names_only_the_specs_of_the_shared_trace_for_the_pods_kind(default_pods) -> None:  # noqa: ANN001
    pods = make_variant(default_pods, "gpuspec33")
    for pod in pods:
        if pod.request.allowed_models:
            pool = {frozenset(spec.split("|")) for spec, _ in SPEC_POOL[kind_of(pod.request)]}
            assert pod.request.allowed_models in pool


@needs_traces
def test_levels_of_a_family_are_nested_and_a_seed_repeats_itself(default_pods) -> None:  # noqa: ANN001
    low, high = make_variant(default_pods, "gpuspec20"), make_variant(default_pods, "gpuspec33")
    assert all(h.request.allowed_models == lo.request.allowed_models
               for lo, h in zip(low, high, strict=True) if lo.request.allowed_models)  # fmt: skip
    assert make_variant(default_pods, "gpuspec20") == low
    assert make_variant(default_pods, "gpuspec20", seed=1) != low


@needs_traces
@pytest.mark.parametrize("level", [40, 60, 100])
def test_gpushare_replaces_whole_gpu_pods_by_sharing_pods(default_pods, level: int) -> None:  # noqa: ANN001
    pods = make_variant(default_pods, f"gpushare{level}")
    assert len(pods) == len(default_pods)
    assert share_of_gpu(pods, lambda p: kind_of(p.request) == "share") == pytest.approx(level, abs=0.2)
    assert sum(kind_of(p.request) == "cpu" for p in pods) == sum(kind_of(p.request) == "cpu" for p in default_pods)


@needs_traces
@pytest.mark.parametrize("level", [20, 50])
def test_multigpu_adds_copies_of_multi_gpu_pods(default_pods, level: int) -> None:  # noqa: ANN001
    pods = make_variant(default_pods, f"multigpu{level}")
    assert share_of_gpu(pods, lambda p: kind_of(p.request) == "multi") == pytest.approx(level, abs=0.3)
    assert {p.request.id for p in default_pods} <= {p.request.id for p in pods}
    assert len({p.request.id for p in pods}) == len(pods)


@needs_traces
@pytest.mark.parametrize("name", ["cpu050", "cpu100", "cpu200", "cpu250"])
def test_cpu_sets_the_share_of_cpu_only_pods(default_pods, name: str) -> None:  # noqa: ANN001
    pods = make_variant(default_pods, name)
    level = parse_variant(name).level_pct  # type: ignore[union-attr]
    assert 100.0 * sum(kind_of(p.request) == "cpu" for p in pods) / len(pods) == pytest.approx(level, abs=0.05)
    gpu = [p for p in pods if p.gpu_milli > 0]
    assert gpu == [p for p in default_pods if p.gpu_milli > 0]


@needs_traces
def test_every_published_level_can_be_generated(default_pods) -> None:  # noqa: ANN001
    for name in PUBLISHED_VARIANTS:
        pods = make_variant(default_pods, name)
        assert [p.request.id for p in pods] == sorted(p.request.id for p in pods)


def test_simulate_runs_a_variant_of_a_small_trace(tiny_trace, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    nodes, pods, published = tiny_trace
    parser = argparse.ArgumentParser(prog="gpusched")
    add_simulate_parser(parser.add_subparsers(dest="command"))
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--published-dir", str(published),
            "--variant", "multigpu40", "--policy", "bestfit", "--seeds", "42", "--quiet"]  # fmt: skip
    assert run_simulate(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "variant multigpu40 generated from tiny_pods" in out
    assert "openb_pod_list_multigpu40" in out
    bad = [arg if arg != "multigpu40" else "nope1" for arg in argv]
    assert run_simulate(parser.parse_args(bad)) == 2


def test_tiny_pod_kinds(tiny_trace) -> None:  # noqa: ANN001
    _, pods, _ = tiny_trace
    kinds = {kind_of(p.request) for p in load_pods(Path(pods))}
    assert kinds == {"share", "whole", "multi", "cpu"}
