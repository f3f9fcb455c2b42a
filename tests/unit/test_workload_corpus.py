"""The workload corpus (tests/corpus/workloads/): real-world-shaped Kubernetes files (NVIDIA's samples,
LLM servers, batch/v1 Jobs, Kubeflow PyTorchJobs, JobSets, MIG and shares, selectors and affinity,
quantities) and malformed or hostile ones. Each ``NAME.yaml`` has ``NAME.json``: the jobs it becomes (each
JobSpec's fields that differ from JobSpec's defaults, its array and its warnings), or every error line.
A ``.json`` without a ``.yaml`` generates its input (``generate``: a head and a line repeated)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpusched_common import events as ev
from gpusched_core.workloads import WorkloadError, read_workloads

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "workloads"
DEFAULTS = {name: info.get_default(call_default_factory=True) for name, info in ev.JobSpec.model_fields.items()
            if not info.is_required()}
ENTRIES = sorted(p.stem for p in CORPUS.glob("*.json"))


def source_of(name: str) -> bytes:
    yaml_path = CORPUS / f"{name}.yaml"
    if yaml_path.exists():
        return yaml_path.read_bytes()
    generate = json.loads((CORPUS / f"{name}.json").read_text())["generate"]
    return (generate["head"] + generate["line"] * generate["times"]).encode()


def compact(spec: dict[str, Any]) -> dict[str, Any]:
    """A JobSpec dict without the fields at their defaults (tenant and gpus always kept)."""
    return {k: v for k, v in spec.items() if k not in DEFAULTS or v != _json(DEFAULTS[k])}


def outcome(data: bytes, tenant: str | None = None) -> dict[str, Any]:
    try:
        workloads = read_workloads(data, tenant=tenant)
    except WorkloadError as exc:
        return {"errors": list(exc.problems)}
    return {"jobs": [{**w.as_dict(), "spec": compact(w.as_dict()["spec"])} for w in workloads]}


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.model_dump(mode="json")))


def test_the_corpus_is_large_and_covers_every_kind():
    assert len(ENTRIES) >= 30
    kinds = {json.loads((CORPUS / f"{name}.json").read_text()).get("jobs", [{}])[0].get("source", "").split(" (")[-1]
             .split(" ")[0] for name in ENTRIES}
    assert {"v1", "batch/v1", "kubeflow.org/v1", "jobset.x-k8s.io/v1alpha2"} <= kinds
    assert sum("errors" in json.loads((CORPUS / f"{n}.json").read_text()) for n in ENTRIES) >= 15
    assert {p.stem for p in CORPUS.glob("*.yaml")} <= set(ENTRIES), "every corpus file has its expectation"


@pytest.mark.parametrize("name", ENTRIES)
def test_corpus_entry(name):
    expected = json.loads((CORPUS / f"{name}.json").read_text())
    got = outcome(source_of(name), expected.get("tenant"))
    assert got == {k: expected[k] for k in ("jobs", "errors") if k in expected}


@pytest.mark.parametrize("name", [n for n in ENTRIES if "jobs" in json.loads((CORPUS / f"{n}.json").read_text())])
def test_every_job_of_the_corpus_is_a_valid_jobspec_round_trip(name):
    """What a dry run prints is what the gateway takes: each spec (the tenant restored) validates as the
    same JobSpec."""
    expected = json.loads((CORPUS / f"{name}.json").read_text())
    for workload in read_workloads(source_of(name), tenant=expected.get("tenant")):
        assert ev.JobSpec.model_validate(workload.spec.model_dump(mode="json")) == workload.spec
