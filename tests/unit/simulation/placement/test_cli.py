"""The ``simulate`` command: flags, seeds, the JSON document and the policy list."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpusched_simulation.placement.cli import add_simulate_parser, parse_policies, parse_seeds, run_simulate


@pytest.mark.parametrize(("text", "seeds"), [("42-44", [42, 43, 44]), ("42,45", [42, 45]),
                                             ("42-43,50", [42, 43, 50]), ("7", [7])])  # fmt: skip
def test_seed_lists_and_ranges_parse(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


def test_all_policies_and_unknown_ones() -> None:
    assert {"random", "bestfit", "packing", "dotprod", "fgd", "ours"} <= set(parse_policies("all"))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown"):
        parse_policies("bestfit,nope")


def simulate(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gpusched")
    add_simulate_parser(parser.add_subparsers(dest="command"))
    return run_simulate(parser.parse_args(["simulate", *argv]))


def test_list_policies_marks_the_published_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate("--list-policies") == 0
    lines = capsys.readouterr().out.splitlines()
    assert "bestfit  [published baseline: 05-BestFit]" in lines
    assert any(line.startswith("ours") and "[ours]" in line for line in lines)


def test_json_has_the_documented_keys(tiny_trace, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    nodes, pods, published = tiny_trace
    out = tmp_path / "result.json"
    status = simulate("--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit,ours", "--seeds", "42-43",
                      "--json", str(out), "--published-dir", str(published), "--quiet")  # fmt: skip
    assert status == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"trace", "nodes", "results", "summary", "best_own_policy"}
    assert doc["trace"] == "tiny_pods" and doc["nodes"] == "tiny_nodes"
    assert len(doc["results"]) == 4
    run = doc["results"][0]
    assert set(run) == {"policy", "seed", "unallocated_gpu_pct", "fragmentation_pct", "placed", "failed", "wall_s"}
    assert set(run["unallocated_gpu_pct"]) <= {"90", "95", "100", "110", "120", "130"}
    bestfit = next(row for row in doc["summary"] if row["policy"] == "bestfit")
    assert set(bestfit) == {"policy", "median_unallocated_gpu_pct_at_100", "published_median_at_100",
                            "published_seed_range_at_100"}  # fmt: skip
    assert bestfit["published_median_at_100"] == 8.0 and bestfit["published_seed_range_at_100"] == [7.0, 9.0]
    assert doc["best_own_policy"] == "ours"
    assert "bestfit" in capsys.readouterr().out


def test_a_missing_trace_file_is_an_error(tmp_path: Path) -> None:
    assert simulate("--pods", str(tmp_path / "missing.csv"), "--quiet") == 2
