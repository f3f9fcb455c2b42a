from __future__ import annotations

import json

import pytest

from gpusched_common import events as ev
from services.admission.core import AdmissionLimits, Unparseable, parse_submission
from gpusched_cli.client import submission_bytes
from tests.builders import T0, a_job

LIMITS = AdmissionLimits()


def raw(spec: ev.JobSpec, job_id: str = "j1") -> bytes:
    return submission_bytes(spec, job_id, now=T0)


def test_a_valid_submission_has_no_reasons_and_a_canonical_model():
    sub = parse_submission(raw(a_job("j1").gpus(2).model("NVIDIA-A100-SXM4-80GB").spec()), LIMITS)
    assert sub.reasons == ()
    assert sub.spec is not None and sub.spec.gpu_model == "A100-80GB"


@pytest.mark.parametrize(("job", "reason"), [
    pytest.param(a_job("j").gpus(0), "gpus must be at least 1, got 0", id="zero-gpus"),
    pytest.param(a_job("j").gpus(-3), "gpus must be at least 1, got -3", id="negative-gpus"),
    pytest.param(a_job("j").gpus(10_000), "gpus 10000 exceeds the limit of 8 GPUs per node",
                 id="absurd-gpus"),
    pytest.param(a_job("j").model("Not a GPU"), "unknown GPU model 'Not a GPU'", id="unknown-model"),
    pytest.param(a_job("j").priority(-1), "priority -1 is outside 0..1000", id="negative-priority"),
    pytest.param(a_job("j").command(), "command is empty: a job without an image needs one", id="empty-command"),
    pytest.param(a_job("j").command("python", ""), "command has an empty part", id="empty-command-part"),
    pytest.param(a_job("j").args("--epochs", "3"), "args are the arguments of an image's entrypoint: with a command, "
                 "put them in the command", id="args-with-a-command"),
    pytest.param(a_job("j").command().args("--epochs"), "args are the arguments of an image's entrypoint: give an image",
                 id="args-without-an-image"),
    pytest.param(a_job("j").image("Not An Image"), "image 'Not An Image' is not an image reference such as "
                 "registry.example/team/train:1.2 (at most 512 characters)", id="bad-image"),
    pytest.param(a_job("j").selector({"-zone": "a"}), "node_selector key '-zone' is not a label name (prefix/name, "
                 "name at most 63 characters)", id="bad-selector-key"),
    pytest.param(a_job("j").selector({"zone": "x" * 64}), f"node_selector value {'x' * 64!r} of 'zone' is not a label "
                 "value (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit)",
                 id="bad-selector-value"),
    pytest.param(a_job("j").gpus(8).gang(0), "nodes 0 is outside 1..64 (nodes per gang)", id="gang-of-none"),
    pytest.param(a_job("j").gpus(8).gang(65), "nodes 65 is outside 1..64 (nodes per gang)", id="gang-too-big"),
    pytest.param(a_job("j").share(0), "gpu_share.milli 0 is outside 1..999 (use gpus for whole GPUs)",
                 id="share-of-nothing"),
    pytest.param(a_job("j").share(1000), "gpu_share.milli 1000 is outside 1..999 (use gpus for whole GPUs)",
                 id="share-of-everything"),
    pytest.param(a_job("j").share(500, 50_000).model("L4-24GB"), "gpu_share.memory_mib 50000 is outside 0..24576",
                 id="share-memory-beyond-the-model-s-class"),
    pytest.param(a_job("j").share(500).gpus(2), "a gpu_share is part of one GPU on one node: gpus and nodes must be 1",
                 id="share-of-two-gpus"),
    pytest.param(a_job("j").share(500).mig("1g.10gb"), "a job asks for a gpu_share or a mig_profile, not both",
                 id="share-and-mig"),
    pytest.param(a_job("j").mig("9g.90gb"), "MIG profile '9g.90gb' does not exist on any MIG-capable GPU model (known: 1g.10gb, "
                 "1g.12gb, 1g.18gb, 1g.20gb, 1g.23gb, 1g.24gb, 1g.35gb, 1g.45gb, 1g.5gb, 2g.10gb, 2g.20gb, 2g.24gb, 2g.35gb, "
                 "2g.45gb, 3g.20gb, 3g.40gb, 3g.47gb, 3g.48gb, 3g.71gb, 3g.90gb, 4g.20gb, 4g.40gb, 4g.47gb, 4g.48gb, 4g.71gb, "
                 "4g.90gb, 7g.141gb, 7g.180gb, 7g.40gb, 7g.80gb, 7g.94gb, 7g.96gb)",
                 id="unknown-mig-profile"),
    pytest.param(a_job("j").mig("1g.5gb").model("H100-80GB"), "MIG profile '1g.5gb' does not exist on a H100-80GB (known: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, "
                 "4g.40gb, 7g.80gb)",
                 id="mig-profile-of-another-model"),
    pytest.param(a_job("j").mig("1g.10gb").model("L4-24GB"), "MIG profile '1g.10gb' does not exist on a L4-24GB: MIG is "
                 "placed only on models whose MIG geometry is known (A100-40GB, A100-80GB, H100-80GB, H100-NVL-94GB, "
                 "H200-141GB, H200-NVL-141GB, GH200-96GB, B200-180GB)", id="mig-on-a-model-without-mig"),
    pytest.param(a_job("j").host(cpu_milli=-1), "cpu_milli -1 is outside 0..1024000 (per node)", id="negative-cpu"),
    pytest.param(a_job("j").host(memory_mib=20 * 1024 * 1024),
                 "memory_mib 20971520 is outside 0..16777216 (per node)", id="memory-beyond-any-node"),
])
def test_limits_are_reported_as_reasons(job, reason):
    sub = parse_submission(raw(job.spec()), LIMITS)
    assert sub.spec is None
    assert reason in sub.reasons


@pytest.mark.parametrize("job", [
    pytest.param(a_job("j").gpus(8).gang(4), id="gang"),
    pytest.param(a_job("j").share(250, 10_000), id="share"),
    pytest.param(a_job("j").mig("3g.40gb").model("A100-80GB"), id="mig-of-a-model"),
    pytest.param(a_job("j").mig("1g.5gb"), id="mig-of-any-model"),
    pytest.param(a_job("j").gpus(8).gang(2).host(cpu_milli=96_000, memory_mib=512 * 1024), id="gang-with-host"),
    pytest.param(a_job("j").command().image("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"),
                 id="an-image-s-entrypoint"),
    pytest.param(a_job("j").image("localhost:5000/team/train@sha256:" + "0" * 64)
                 .selector({"nvidia.com/gpu.family": "hopper", "zone": "eu-1"}), id="image-and-selector"),
    pytest.param(a_job("j").command().image("vllm/vllm-openai:v0.6.3").args("--model", "m"), id="entrypoint-args"),
])
def test_gangs_shares_and_mig_slices_are_admitted(job):
    sub = parse_submission(raw(job.spec()), LIMITS)
    assert sub.reasons == () and sub.spec == job.spec()


def test_every_reason_is_reported_at_once():
    sub = parse_submission(raw(a_job("j").gpus(0).model("Not a GPU").priority(-5).spec()), LIMITS)
    assert len(sub.reasons) == 3


def test_an_unknown_field_is_rejected_with_its_name():
    doc = json.loads(raw(a_job("j1").spec()))
    doc["payload"]["spec"]["gpuz"] = 3
    sub = parse_submission(json.dumps(doc).encode(), LIMITS)
    assert sub.job_id == "j1"
    assert sub.reasons == ("unknown field 'spec.gpuz'",)
    assert sub.tenant_hint == "team-a"


def test_a_wrong_type_is_rejected_with_a_reason():
    doc = json.loads(raw(a_job("j1").spec()))
    doc["payload"]["spec"]["gpus"] = "lots"
    sub = parse_submission(json.dumps(doc).encode(), LIMITS)
    assert sub.reasons and "spec.gpus" in sub.reasons[0]


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b'{"payload": {}}', b"\xff\xfe"])
def test_a_message_without_a_job_id_is_unparseable(body):
    with pytest.raises(Unparseable):
        parse_submission(body, LIMITS)


def test_an_oversized_submission_is_rejected_against_its_job():
    spec = a_job("j1").command("echo", "x" * (1024 * 1024)).spec()
    sub = parse_submission(raw(spec), LIMITS)
    assert sub.job_id == "j1"
    assert sub.spec is None
    assert "limit is 1048576 bytes" in sub.reasons[0]


def test_only_a_known_credential_s_failures_are_answered_with_a_rejection():
    from gpusched_common.identity import Verdict
    from services.admission.core import failure_key, unauthenticated

    assert unauthenticated(Verdict(None, "unknown producer 'abc'"))
    assert unauthenticated(Verdict(None, "producer 'ci' (p1) is revoked"))
    assert not unauthenticated(Verdict(None, "producer 'ci' may not submit for tenant 'c'", authenticated=True))
    assert not unauthenticated(Verdict("a", None)) and not unauthenticated(Verdict(None, None))  # development
    assert failure_key("unknown producer 'f00dfeedf00dfeed'", "f00dfeedf00dfeed") == ("unknown credential", "-")
    assert failure_key("missing credential: ...", None) == ("missing credential", "-")
    assert failure_key("producer 'ci' (p1) is revoked", "p1") == ("producer 'ci' (p1) is revoked", "p1")
