"""`gpusched submit` with --image, --arg, --selector and --priority-class: the JobSpec the flags build (a
dry run shows it and sends nothing; a submission sends it), the refusals of flags that make no job (one
line, exit 2, never a traceback); and ``gpusched.Client`` with workload files: ``submit_pod`` sends one
document and refuses several, ``submit_workloads`` sends each job as its JobSpec (as ``submit -f`` does)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gpusched import Client, WorkloadError
from gpusched_cli import job_commands
from gpusched_cli.main import main

from tests.unit.test_workload_cli import NoGateway, RecordingGateway

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "workloads"
IMAGE = "registry.example/team/train:1.2"




@pytest.fixture
def no_gateway(monkeypatch):
    monkeypatch.setattr(job_commands, "Client", NoGateway)


@pytest.fixture
def gateway(monkeypatch):
    RecordingGateway.submitted = []
    monkeypatch.setattr(job_commands, "Client", RecordingGateway)
    return RecordingGateway.submitted


def dry_run(capsys, *flags: str) -> dict:
    assert main(["submit", "--dry-run", "--json", *flags]) == 0
    [job] = json.loads(capsys.readouterr().out)
    assert job["source"] == "flags"
    return job["spec"]


def refused(capsys, *flags: str) -> str:
    assert main(["submit", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    [line] = captured.err.strip().splitlines()
    assert line.startswith("gpusched submit: ")
    return line


# --- the flags ---------------------------------------------------------------------------------------


def test_an_image_alone_runs_its_entrypoint(no_gateway, capsys):
    spec = dry_run(capsys, "--image", IMAGE)
    assert (spec["image"], spec["command"], spec["args"]) == (IMAGE, [], [])
    spec = dry_run(capsys, "--image", IMAGE, "--")  # an empty command after --
    assert (spec["image"], spec["command"]) == (IMAGE, [])


def test_an_image_with_a_command_runs_the_command_in_it(no_gateway, capsys):
    spec = dry_run(capsys, "--image", IMAGE, "--gpus", "2", "--", "python", "train.py")
    assert (spec["image"], spec["command"], spec["gpus"]) == (IMAGE, ["python", "train.py"], 2)


def test_args_are_the_entrypoint_s_in_order(no_gateway, capsys):
    spec = dry_run(capsys, "--image", IMAGE, "--arg=--epochs", "--arg", "3", "--arg", "a b")
    assert (spec["command"], spec["args"]) == ([], ["--epochs", "3", "a b"])


def test_selectors_and_a_priority_class(no_gateway, capsys):
    spec = dry_run(capsys, "--selector", "zone=us-east-1a", "--selector", "example.com/tier=gold=1",
                   "--selector", "empty=", "--selector", "zone=us-east-1a", "--priority-class", "high",
                   "--", "python", "a.py")
    assert spec["node_selector"] == {"zone": "us-east-1a", "example.com/tier": "gold=1", "empty": ""}
    assert (spec["priority_class"], spec["priority"]) == ("high", 0)


def test_without_the_new_flags_the_spec_has_none_of_them(no_gateway, capsys):
    spec = dry_run(capsys, "--", "python", "a.py")
    assert (spec["image"], spec["args"], spec["node_selector"], spec["priority_class"]) == (None, [], {}, None)


def test_the_table_of_a_dry_run_shows_them(no_gateway, capsys):
    assert main(["submit", "--dry-run", "--image", IMAGE, "--arg", "x", "--selector", "zone=a",
                 "--priority-class", "high"]) == 0
    out = capsys.readouterr().out
    assert f"{IMAGE}: (its entrypoint) x" in out and "zone=a" in out and "priority high" in out
    assert out.rstrip().endswith("(dry run: nothing was sent)")


@pytest.mark.parametrize("pair", ["zone", "=us-east-1a", ""])
def test_a_malformed_selector_is_one_line_and_exit_2(no_gateway, capsys, pair):
    assert "is not KEY=VALUE" in refused(capsys, "--selector", pair, "--image", IMAGE)


def test_a_selector_given_two_values_is_refused(no_gateway, capsys):
    line = refused(capsys, "--selector", "zone=a", "--selector", "zone=b", "--image", IMAGE)
    assert "--selector zone is given twice ('a' and 'b')" in line


def test_no_command_and_no_image_is_refused(no_gateway, capsys):
    assert "or an --image" in refused(capsys, "--gpus", "1")
    assert "or an --image" in refused(capsys, "--dry-run", "--selector", "zone=a", "--")


def test_args_need_an_image_and_no_command(no_gateway, capsys):
    assert "give an --image" in refused(capsys, "--arg", "x")
    assert "put it in the command" in refused(capsys, "--image", IMAGE, "--arg", "x", "--", "python", "a.py")


def test_the_job_s_flags_are_refused_with_a_file(no_gateway, capsys):
    for flags in (["--image", IMAGE], ["--selector", "zone=a"], ["--arg", "x"]):
        assert "with -f the file does" in refused(capsys, "-f", str(CORPUS / "pod-bare-spec.yaml"), *flags)


def test_a_priority_class_overrides_the_file_s(no_gateway, capsys):
    assert main(["submit", "-f", str(CORPUS / "multi-document.yaml"), "--priority-class", "low", "--dry-run",
                 "--json"]) == 0
    assert {j["spec"]["priority_class"] for j in json.loads(capsys.readouterr().out)} == {"low"}


def test_submit_sends_the_spec_of_the_flags(gateway, capsys):
    assert main(["submit", "--image", IMAGE, "--arg", "serve", "--selector", "zone=a", "--priority-class", "high",
                 "--request-id", "k1"]) == 0
    [(spec, key, array)] = gateway
    assert spec == {"gpus": 1, "nodes": 1, "command": [], "image": IMAGE, "args": ["serve"],
                    "node_selector": {"zone": "a"}, "priority_class": "high"}
    assert (key, array) == ("k1", None)
    assert "submitted j-1 for tenant bound: Submitted" in capsys.readouterr().out


# --- the client library --------------------------------------------------------------------------------


class Gateway:
    """A gateway behind an httpx.MockTransport: records each request, answers a job."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[httpx.Request] = []
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status >= 400:
            return httpx.Response(self.status, json={"detail": "refused", "reasons": ["no"]})
        return httpx.Response(200, json={"job_id": f"j-{len(self.requests)}", "state": "Submitted"})

    def client(self) -> Client:
        return Client("http://gateway.test", "token", transport=httpx.MockTransport(self))


def test_client_submit_sends_the_new_fields_from_a_dict_or_a_jobspec():
    from gpusched_common import events as ev

    gateway = Gateway()
    spec = {"gpus": 1, "image": IMAGE, "args": ["--epochs", "3"], "node_selector": {"zone": "a"},
            "priority_class": "high"}
    with gateway.client() as client:
        client.submit(spec)
        client.submit(ev.JobSpec.model_validate({"tenant": "research", **spec}))
    first, second = (json.loads(r.content) for r in gateway.requests)
    assert first == spec
    assert {k: second[k] for k in (*spec, "tenant")} == {**spec, "tenant": "research"}
    assert "gpu_model" not in second  # None is left out, as the CLI sends it


def test_submit_pod_sends_one_document_as_yaml():
    gateway = Gateway()
    text = (CORPUS / "pod-bare-spec.yaml").read_text()
    with gateway.client() as client:
        assert client.submit_pod(text + "\n---\n", idempotency_key="k")["job_id"] == "j-1"  # an empty document
    [request] = gateway.requests
    assert request.headers["content-type"] == "application/yaml" and request.content == (text + "\n---\n").encode()
    assert request.headers["idempotency-key"] == "k"


def test_submit_pod_refuses_several_documents_and_sends_nothing():
    gateway = Gateway()
    with gateway.client() as client, pytest.raises(WorkloadError) as refusal:
        client.submit_pod((CORPUS / "multi-document.yaml").read_text())
    assert gateway.requests == []
    assert "submit_workloads" in str(refusal.value) and "gpusched submit -f" in str(refusal.value)
    assert isinstance(refusal.value, ValueError)


def test_submit_workloads_sends_each_job_as_its_jobspec_like_submit_f():
    gateway = Gateway()
    text = (CORPUS / "multi-document.yaml").read_text() + "---\n" + (CORPUS / "job-parallel.yaml").read_text()
    with gateway.client() as client:
        answers = client.submit_workloads(text, idempotency_key="k1", hold=True)
    assert [a["job_id"] for a in answers] == ["j-1", "j-2", "j-3"]
    bodies = [json.loads(r.content) for r in gateway.requests]
    assert [b["name"] for b in bodies] == ["prepare", "train", "hparam-sweep"]
    assert all("array" not in b for b in bodies) and bodies[1]["image"] == "train:1"
    assert [r.headers["idempotency-key"] for r in gateway.requests] == ["k1.0", "k1.1", "k1.2"]
    assert [dict(r.url.params) for r in gateway.requests] == [{"hold": "true"}] * 2 + [
        {"hold": "true", "array": "0-7%2"}]
    # the CLI sends the same bodies
    RecordingGateway.submitted = []
    job_commands.Client, saved = RecordingGateway, job_commands.Client
    try:
        path = CORPUS / "multi-document.yaml"
        assert main(["submit", "-f", str(path)]) == 0
    finally:
        job_commands.Client = saved
    assert [s for s, _, _ in RecordingGateway.submitted] == bodies[:2]


def test_submit_workloads_of_one_job_keeps_its_key_and_leaves_the_tenant_to_the_gateway():
    gateway = Gateway()
    with gateway.client() as client:
        client.submit_workloads((CORPUS / "no-namespace-refused.yaml").read_bytes(), idempotency_key="k")
    [request] = gateway.requests
    assert request.headers["idempotency-key"] == "k" and "tenant" not in json.loads(request.content)
    with gateway.client() as client:
        client.submit_workloads((CORPUS / "no-namespace-refused.yaml").read_bytes(), tenant="research")
    assert json.loads(gateway.requests[1].content)["tenant"] == "research"


def test_submit_workloads_refuses_a_bad_file_before_sending_anything():
    gateway = Gateway()
    with gateway.client() as client, pytest.raises(WorkloadError) as refusal:
        client.submit_workloads((CORPUS / "multi-document-one-bad-refused.yaml").read_text())
    assert gateway.requests == [] and len(refusal.value.problems) == 3


def test_a_refusal_stops_the_rest():
    from gpusched import ApiError

    gateway = Gateway(status=422)
    with gateway.client() as client, pytest.raises(ApiError) as refusal:
        client.submit_workloads((CORPUS / "multi-document.yaml").read_text())
    assert len(gateway.requests) == 1 and refusal.value.status == 422 and refusal.value.reasons == ["no"]
