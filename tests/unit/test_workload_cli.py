"""`gpusched submit -f FILE --dry-run [--json]`, `gpusched convert FILE [-o yaml|json]` and `gpusched
submit -f FILE` of a multi-document file: what each prints, that a dry run sends nothing, and that
problems are one line each with a non-zero exit, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpusched_cli import job_commands
from gpusched_cli.main import main

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "workloads"


class NoGateway:
    """Fails the test if a dry run or a convert reaches for the gateway."""

    @classmethod
    def from_config(cls):
        raise AssertionError("a dry run sent something")


class RecordingGateway:
    submitted: list[tuple[dict, str | None, str | None]] = []

    @classmethod
    def from_config(cls):
        return cls()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, spec, *, idempotency_key=None, hold=False, array=None):
        self.submitted.append((spec, idempotency_key, array))
        if array:
            return {"job_id": "a-1", "array_id": "a-1", "tenant": spec.get("tenant", "bound"), "tasks": 8,
                    "indices": array, "replayed": False}
        return {"job_id": f"j-{len(self.submitted)}", "tenant": spec.get("tenant", "bound"), "state": "Submitted"}


@pytest.fixture
def no_gateway(monkeypatch):
    monkeypatch.setattr(job_commands, "Client", NoGateway)


def test_dry_run_json_prints_each_job_and_sends_nothing(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "multi-document.yaml"), "--dry-run", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)
    assert [j["source"] for j in jobs] == ["document 1 (v1 Pod prepare)", "document 3 (batch/v1 Job train)"]
    assert jobs[1]["spec"]["gpus"] == 4 and jobs[1]["spec"]["image"] == "train:1" and jobs[1]["array"] is None
    assert set(jobs[0]) == {"source", "spec", "array", "warnings"}
    assert {"image", "time_limit_s", "nodes", "node_selector", "priority_class", "array"} <= set(jobs[0]["spec"])


def test_dry_run_table_shows_arrays_gangs_and_warnings(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "job-parallel.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "0-7%2" in out and "hparam-sweep" in out and "restartPolicy: OnFailure ignored" in out
    assert out.rstrip().endswith("(dry run: nothing was sent)")
    assert main(["submit", "-f", str(CORPUS / "pytorchjob-master-workers.yaml"), "--dry-run"]) == 0
    assert "4x8 GPU (gang)" in capsys.readouterr().out


def test_the_flags_override_the_file_in_a_dry_run(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "pod-bare-spec.yaml"), "--tenant", "research", "--priority", "7",
                 "--time-limit", "2h", "--after", "j-1:any", "--dry-run", "--json"]) == 0
    [job] = json.loads(capsys.readouterr().out)
    assert (job["spec"]["tenant"], job["spec"]["priority"], job["spec"]["time_limit_s"]) == ("research", 7, 7200)
    assert job["spec"]["after"] == [{"job_id": "j-1", "condition": "any"}]


def test_a_file_naming_no_tenant_is_shown_for_the_caller_s(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "no-namespace-refused.yaml"), "--dry-run", "--json"]) == 0
    [job] = json.loads(capsys.readouterr().out)
    assert job["spec"]["tenant"] is None


def test_problems_are_one_line_each_and_exit_non_zero(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "multi-document-one-bad-refused.yaml"), "--dry-run", "--json"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 3 and all(line.startswith("gpusched submit: document ") for line in lines)
    assert "Traceback" not in captured.err
    assert main(["convert", str(CORPUS / "hostile-alias-bomb.yaml")]) == 2
    assert capsys.readouterr().err.startswith("gpusched convert: document 1: line 7, column 10: alias *a")
    assert main(["convert", "/nonexistent/pod.yaml"]) == 2
    assert "No such file" in capsys.readouterr().err


def test_convert_shows_what_a_file_becomes_as_yaml_or_json(no_gateway, capsys):
    assert main(["convert", str(CORPUS / "jobset-one-gang.yaml")]) == 0
    [job] = yaml.safe_load(capsys.readouterr().out)
    assert (job["spec"]["nodes"], job["spec"]["gpus"], job["spec"]["gpu_model"]) == (8, 8, "NVIDIA-H100-80GB-HBM3")
    assert main(["convert", str(CORPUS / "job-indexed.yaml"), "-o", "json"]) == 0
    [job] = json.loads(capsys.readouterr().out)
    assert job["array"] == "0-4%5" and job["spec"]["time_limit_s"] == 1800


def test_the_flags_alone_can_be_a_dry_run(no_gateway, capsys):
    assert main(["submit", "--dry-run", "--json", "--gpus", "2", "--", "python", "a.py"]) == 0
    [job] = json.loads(capsys.readouterr().out)
    assert (job["source"], job["spec"]["gpus"], job["spec"]["command"], job["spec"]["tenant"]) == (
        "flags", 2, ["python", "a.py"], None)


def test_submit_sends_every_job_of_a_file_with_its_array(monkeypatch, capsys):
    RecordingGateway.submitted = []
    monkeypatch.setattr(job_commands, "Client", RecordingGateway)
    path = CORPUS / "multi-document.yaml"
    extra = (CORPUS / "job-parallel.yaml").read_text()
    text = path.read_text() + "---\n" + extra
    monkeypatch.setattr("sys.stdin", type("In", (), {"buffer": type("B", (), {"read": lambda self, n: text.encode()})()})())
    assert main(["submit", "-f", "-", "--request-id", "k1"]) == 0
    sent = RecordingGateway.submitted
    assert [(s["name"], key, array) for s, key, array in sent] == [
        ("prepare", "k1.0", None), ("train", "k1.1", None), ("hparam-sweep", "k1.2", "0-7%2")]
    assert all("array" not in s for s, _, _ in sent)
    err = capsys.readouterr().err
    assert "warning: document 4 (batch/v1 Job hparam-sweep): spec.template.spec.restartPolicy" in err
    RecordingGateway.submitted = []
    assert main(["submit", "-f", str(path), "--wait"]) == 2  # --wait follows one job
    assert RecordingGateway.submitted == [] and "--wait follows one job" in capsys.readouterr().err


def test_submit_of_a_file_naming_no_tenant_leaves_the_tenant_to_the_gateway(monkeypatch, capsys):
    RecordingGateway.submitted = []
    monkeypatch.setattr(job_commands, "Client", RecordingGateway)
    assert main(["submit", "-f", str(CORPUS / "no-namespace-refused.yaml")]) == 0
    [(spec, key, array)] = RecordingGateway.submitted
    assert "tenant" not in spec and spec["image"] == "cuda:12" and key is None
    assert "submitted j-1 for tenant bound" in capsys.readouterr().out
