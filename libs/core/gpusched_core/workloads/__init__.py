"""Workload files as job submissions (pure): the YAML people already run on Kubernetes, read strictly
(``yamlread``), one job per document: a ``v1 Pod`` or a bare pod spec, a ``batch/v1 Job`` (an array when it
has several completions), a ``kubeflow.org/v1 PyTorchJob`` or a ``jobset.x-k8s.io/v1alpha2 JobSet`` (a gang)
(``kinds``); its pod template as a JobSpec (``pod``), with exact quantities (``quantities``).

``read_workloads`` gives each job's JobSpec, its array expression and the warnings about what the file
asks for that gpusched does not do (``spec.tolerations: ignored: gpusched does not taint nodes``); or
raises ``WorkloadError`` with every problem of every document, each naming the document and the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpusched_common import events as ev

from gpusched_core.arrays import ArrayError, parse_array
from gpusched_core.submission import error_reasons
from gpusched_core.workloads.kinds import read_object
from gpusched_core.workloads.pod import ARRAY_ANNOTATION, Template, array_of, job_fields
from gpusched_core.workloads.reading import Doc, type_name
from gpusched_core.workloads.yamlread import YamlProblem, documents

__all__ = ["UNBOUND_TENANT", "Workload", "WorkloadError", "named_namespace", "read_workloads"]

UNBOUND_TENANT = ""  # a job whose file names no tenant, read without one: the gateway gives the caller's
_SAME_ASKS = ("gpus", "mig_profile", "gpu_share", "cpu_milli", "memory_mib", "gpu_model", "node_selector")


@dataclass(frozen=True)
class Workload:
    """One job a file defines: its spec, its array expression (``0-9%2``; the gateway expands it), what
    the file asks for that gpusched does not do, and where it comes from (``document 2 (batch/v1 Job x)``)."""

    spec: ev.JobSpec
    array: str | None
    warnings: tuple[str, ...]
    source: str

    def as_dict(self) -> dict[str, Any]:
        spec = self.spec.model_dump(mode="json")
        if spec["tenant"] == UNBOUND_TENANT:
            spec["tenant"] = None
        return {"source": self.source, "spec": spec, "array": self.array, "warnings": list(self.warnings)}


class WorkloadError(ValueError):
    """A file that defines no job gpusched can run: every problem, one line each."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def read_workloads(data: str | bytes, *, tenant: str | None = None, priority: int | None = None,
                   tenant_required: bool = True) -> list[Workload]:
    """Every job of a workload file. ``tenant``/``priority`` override what the file says; a file naming no
    tenant (``metadata.namespace``) is refused unless ``tenant_required`` is False (its jobs then have
    ``UNBOUND_TENANT``)."""
    workloads: list[Workload] = []
    problems: list[str] = []
    try:
        for number, value in documents(data):
            doc = Doc()
            label, workload = _document(doc, value, tenant, priority, tenant_required)
            source = f"document {number} ({label})" if label else f"document {number}"
            if doc.problems:
                problems.extend(f"{source}: {problem}" for problem in doc.problems)
            elif workload is not None:
                spec, array = workload
                workloads.append(Workload(spec, array, tuple(doc.warnings), source))
    except YamlProblem as exc:
        problems.append(f"document {exc.document}: {exc}" if exc.document else str(exc))
    if not problems and not workloads:
        problems.append("the file defines no job (it has no document)")
    if problems:
        raise WorkloadError(problems)
    return workloads


def named_namespace(data: str | bytes) -> str | None:
    """The ``metadata.namespace`` of a file's first document, if it names one (None when unreadable:
    ``read_workloads`` says why)."""
    try:
        for _, value in documents(data):
            metadata = value.get("metadata") if isinstance(value, dict) else None
            namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
            return namespace if isinstance(namespace, str) else None
    except YamlProblem:
        return None
    return None


def _document(doc: Doc, value: Any, tenant: str | None, priority: int | None,
              tenant_required: bool) -> tuple[str | None, tuple[ev.JobSpec, str | None] | None]:
    if not isinstance(value, dict):
        doc.problem("", f"a document is a mapping (a Kubernetes object or a pod spec), got {type_name(value)}")
        return None, None
    label, template = read_object(doc, value)
    if template is None:
        if not doc.problems:
            doc.problem("", "defines nothing to run")
        return label, None
    fields = job_fields(doc, template)
    _companions(doc, template, fields)
    array = array_of(doc, template)
    if array is not None:
        try:
            parse_array(array)
        except ArrayError as exc:
            doc.problem(template.where(ARRAY_ANNOTATION) if template.array is None else "spec", str(exc))
    owner = tenant or template.namespace
    if owner is None:
        if tenant_required:
            doc.problem("metadata.namespace", "no tenant: pass --tenant or set metadata.namespace")
        owner = UNBOUND_TENANT
    if doc.problems:
        return label, None
    if priority is not None:
        fields["priority"] = priority
    try:
        return label, (ev.JobSpec(tenant=owner, **fields), array)
    except ValidationError as exc:
        for reason in error_reasons(exc):
            doc.problem("", reason)
        return label, None


def _companions(doc: Doc, lead: Template, fields: dict[str, Any]) -> None:
    """The other replicas of a gang (a PyTorchJob's Workers beside its Master) ask for what the first does;
    what runs is the first's."""
    first = "Master" if ".Master." in lead.path else "first replica"
    for path, other in lead.companions:
        other.env = dict(lead.env)  # what the kind adds, for every member
        theirs = job_fields(doc, other)
        for key in _SAME_ASKS:
            if key in theirs and theirs[key] != fields.get(key):
                doc.problem(path, f"asks for {key} {_show(theirs[key])}, the {first} {_show(fields.get(key))}: "
                                  "every member of a gang asks for the same")
        for key in ("image", "command", "args", "env"):
            if key in theirs and theirs[key] != fields.get(key):
                doc.warn(path, f"its {key} differs from the {first}'s: gpusched runs the {first}'s on every member")


def _show(value: Any) -> str:
    return "none" if value in (None, {}, []) else repr(value)
