"""`gpusched agent --check` on the simulated backend (and its message where no GPU exists)."""

from __future__ import annotations

import argparse
import json

from gpusched_cli.agent_check import add_agent_parser
from services.node_agent.real_nvml import NvmlUnavailable, RealNvml


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpusched")
    add_agent_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["agent", *argv])


def test_check_prints_inventory_health_and_samples_as_json(capsys):
    args = parse("--check", "--json", "--simulated", "A100-80GB:2:mig=3g.40gb+3g.40gb", "--samples", "2",
                 "--interval", "0")
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "simulated" and len(report["gpus"]) == 2
    assert [d["profile"] for d in report["gpus"][0]["mig_devices"]] == ["3g.40gb", "3g.40gb"]
    assert len(report["samples"]) == 2 and all(h["reachable"] for h in report["health"])


def test_check_as_a_table(capsys):
    args = parse("--check", "--simulated", "L4:1", "--samples", "1")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "L4-24GB" in out and "UTIL" in out


def test_check_on_real_nvml_says_why_it_cannot_run_without_a_gpu(capsys):
    try:
        RealNvml().close()
        has_gpu = True
    except NvmlUnavailable:
        has_gpu = False
    args = parse("--check", "--samples", "1", "--interval", "0")
    code = args.func(args)
    if has_gpu:
        assert code == 0
    else:
        assert code == 1 and "--simulated" in capsys.readouterr().err


def test_a_bad_simulated_spec_is_a_usage_error(capsys):
    args = parse("--check", "--simulated", "B9000:2")
    assert args.func(args) == 2 and "unknown GPU model" in capsys.readouterr().err
