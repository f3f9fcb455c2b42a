"""The node check (services/node_agent/check.py) on the simulated backend and its message where no GPU
exists, each run both ways: in the agent's own module and through `gpusched agent --check`, which runs
`python -m services.node_agent --check` and passes on its output and exit code."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from gpusched_cli.agent_check import add_agent_parser, check_argv
from services.node_agent import check as node_check
from services.node_agent.real_nvml import NvmlUnavailable, RealNvml


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpusched")
    add_agent_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["agent", *argv])


def through_the_cli(*argv: str) -> int:
    args = parse(*argv)
    return args.func(args)


@pytest.fixture(params=[through_the_cli, node_check.main], ids=["gpusched agent --check", "node agent check"])
def run_check(request) -> Callable[..., int]:
    if request.param is node_check.main:
        return lambda *argv: node_check.main(list(argv))
    return request.param


def test_check_prints_inventory_health_and_samples_as_json(run_check, capsys):
    code = run_check("--check", "--json", "--simulated", "A100-80GB:2:mig=3g.40gb+3g.40gb", "--samples", "2",
                     "--interval", "0")
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "simulated" and len(report["gpus"]) == 2
    assert [d["profile"] for d in report["gpus"][0]["mig_devices"]] == ["3g.40gb", "3g.40gb"]
    assert len(report["samples"]) == 2 and all(h["reachable"] for h in report["health"])


def test_check_as_a_table(run_check, capsys):
    assert run_check("--check", "--simulated", "L4-24GB:1", "--samples", "1") == 0
    out = capsys.readouterr().out
    assert "L4-24GB" in out and "UTIL" in out


def test_check_on_real_nvml_says_why_it_cannot_run_without_a_gpu(run_check, capsys):
    try:
        RealNvml().close()
        has_gpu = True
    except NvmlUnavailable:
        has_gpu = False
    code = run_check("--check", "--samples", "1", "--interval", "0")
    if has_gpu:
        assert code == 0
    else:
        assert code == 1 and "--simulated" in capsys.readouterr().err


def test_a_bad_simulated_spec_is_a_usage_error(run_check, capsys):
    assert run_check("--check", "--simulated", "B9000:2") == 2 and "unknown GPU model" in capsys.readouterr().err


def test_the_cli_passes_every_flag_on_to_the_agent_check():
    args = parse("--check", "--json", "--simulated", "L4-24GB:1", "--samples", "-1", "--interval", "0.25",
                 "--node-id=-odd")
    passed = node_check.add_check_arguments(argparse.ArgumentParser()).parse_args(check_argv(args))
    assert vars(passed) == {k: v for k, v in vars(args).items() if k not in ("cmd", "func")}


def test_the_agent_module_runs_the_check_and_exits_with_its_code():
    done = subprocess.run([sys.executable, "-m", "services.node_agent", "--check", "--simulated", "B9000:2"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown GPU model" in done.stderr


def test_the_cli_commands_import_no_service_module():
    probe = ("import sys, gpusched_cli.agent_check, gpusched_cli.teardown; "
             "print(sorted(m for m in sys.modules if m == 'services' or m.startswith('services.')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
