"""The Kubernetes kinds a workload file may hold, each as one pod template and what its kind adds (pure):
``v1 Pod`` (or a bare pod spec), ``batch/v1 Job`` (its template; ``completions`` > 1 an array of that many
tasks, at most ``parallelism`` at once), ``kubeflow.org/v1 PyTorchJob`` (Master and Worker replicas one
gang, the Master's container run on every member) and ``jobset.x-k8s.io/v1alpha2 JobSet`` (its one
replicatedJob's ``replicas`` x ``parallelism`` pods one gang)."""

from __future__ import annotations

from typing import Any

from gpusched_core.workloads.pod import Template
from gpusched_core.workloads.reading import Doc, at

API_VERSIONS = {"Pod": "v1", "Job": "batch/v1", "PyTorchJob": "kubeflow.org/v1", "JobSet": "jobset.x-k8s.io/v1alpha2"}
OBJECT_READ = frozenset({"apiVersion", "kind", "metadata", "spec"})
OBJECT_IGNORED = {"status": "the status is written by the cluster"}
_NO_RETRY = "gpusched does not retry a failed job"
_HISTORY = "a finished job stays in gpusched's history"
_SUSPENDED = "a suspended job: submit it held (gpusched submit --hold) and release it"
JOB_READ = frozenset({"template", "completions", "parallelism", "completionMode", "activeDeadlineSeconds", "suspend"})
JOB_IGNORED = {"backoffLimit": _NO_RETRY, "backoffLimitPerIndex": _NO_RETRY, "maxFailedIndexes": _NO_RETRY,
               "podFailurePolicy": _NO_RETRY, "podReplacementPolicy": _NO_RETRY, "ttlSecondsAfterFinished": _HISTORY,
               "successPolicy": "a Job ends when each of its tasks has ended",
               "selector": "gpusched tracks a job's runs itself", "manualSelector": "gpusched tracks a job's runs itself",
               "managedBy": "gpusched runs the job"}
PYTORCH_ROLES = ("Master", "Worker")


def kinds_read() -> str:
    return ", ".join(f"{api} {kind}" for kind, api in API_VERSIONS.items())


def read_object(doc: Doc, obj: dict[str, Any]) -> tuple[str | None, Template | None]:
    """(what the document is, e.g. ``batch/v1 Job sweep``; its template, None when it has problems that
    leave none)."""
    api, kind = obj.get("apiVersion"), obj.get("kind")
    if api is None and kind is None:
        if "containers" in obj:
            return "pod spec", Template(pod=obj, path="")
        if "spec" in obj:
            return _object(doc, obj, "v1", "Pod")
        doc.problem("", "neither a Kubernetes object (apiVersion and kind) nor a pod spec (containers)")
        return None, None
    if kind is None:
        doc.problem("kind", f"missing: the kind of object ({', '.join(API_VERSIONS)})")
        return None, None
    if not isinstance(kind, str) or not isinstance(api, str | None):
        doc.wrong("kind" if not isinstance(kind, str) else "apiVersion", "a string", kind if not isinstance(kind, str) else api)
        return None, None
    if kind not in API_VERSIONS or api not in (None, API_VERSIONS[kind]):
        doc.problem("", f"apiVersion {api or '(none)'}, kind {kind}: not a kind gpusched reads (it reads {kinds_read()})")
        return f"{api} {kind}", None
    if api is None:
        doc.warn("apiVersion", f"not set: read as {API_VERSIONS[kind]} {kind}")
    return _object(doc, obj, API_VERSIONS[kind], kind)


def _object(doc: Doc, obj: dict[str, Any], api: str, kind: str) -> tuple[str | None, Template | None]:
    doc.rest(obj, "", OBJECT_READ, OBJECT_IGNORED, what="field of an object")
    meta = doc.mapping(obj, "metadata", "")
    name = doc.string(meta, "name", "metadata") or doc.string(meta, "generateName", "metadata")
    base = Template(pod={}, path="", name=name, namespace=doc.string(meta, "namespace", "metadata"))
    _annotate(doc, base, meta, "metadata")
    label = f"{api} {kind}" + (f" {name}" if name else "")
    spec = doc.mapping(obj, "spec", "", required=True)
    if not spec:
        if not doc.problems:
            doc.problem("spec", "empty: nothing to run")
        return label, None
    reader = {"Pod": _pod, "Job": _job, "PyTorchJob": _pytorchjob, "JobSet": _jobset}[kind]
    return label, reader(doc, spec, base)


def _annotate(doc: Doc, t: Template, meta: dict[str, Any], path: str) -> None:
    """Add the annotations of ``meta`` (at ``path``) to the template's, later ones winning."""
    for key, value in doc.mapping(meta, "annotations", path).items():
        t.annotations[key] = value
        t.annotation_paths[key] = at(at(path, "annotations"), key)


def _with_pod(t: Template, pod: dict[str, Any], path: str) -> Template:
    return Template(pod=pod, path=path, name=t.name, namespace=t.namespace, annotations=dict(t.annotations),
                    annotation_paths=dict(t.annotation_paths))


def _pod(doc: Doc, spec: dict[str, Any], base: Template) -> Template:
    return _with_pod(base, spec, "spec")


def _template(doc: Doc, parent: dict[str, Any], path: str, base: Template) -> Template | None:
    """``parent.template`` (a pod template: metadata and spec) over ``base``."""
    tpath = at(path, "template")
    template = doc.mapping(parent, "template", path, required=True)
    doc.rest(template, tpath, {"metadata", "spec"}, {})
    pod = doc.mapping(template, "spec", tpath, required=bool(template) or "template" in parent)
    if not pod:
        return None
    t = _with_pod(base, pod, at(tpath, "spec"))
    _annotate(doc, t, doc.mapping(template, "metadata", tpath), at(tpath, "metadata"))
    return t


def _job_spec(doc: Doc, spec: dict[str, Any], path: str, base: Template) -> tuple[Template | None, int | None, int | None]:
    """A Job's template, completions and parallelism, its deadline set as the template's time limit."""
    doc.rest(spec, path, JOB_READ, JOB_IGNORED, what="Job field")
    if doc.flag(spec, "suspend", path):
        doc.problem(at(path, "suspend"), f"not supported: {_SUSPENDED}")
    mode = doc.string(spec, "completionMode", path)
    if mode not in (None, "NonIndexed", "Indexed"):
        doc.problem(at(path, "completionMode"), f"{mode!r} is neither NonIndexed nor Indexed")
    completions = doc.integer(spec, "completions", path, minimum=1)
    parallelism = doc.integer(spec, "parallelism", path, minimum=1)
    t = _template(doc, spec, path, base)
    if t is not None:
        t.time_limit_s = doc.seconds(spec, "activeDeadlineSeconds", path)
    return t, completions, parallelism


def _job(doc: Doc, spec: dict[str, Any], base: Template) -> Template | None:
    t, completions, parallelism = _job_spec(doc, spec, "spec", base)
    if t is None:
        return None
    if completions is not None and completions > 1:
        t.array = f"0-{completions - 1}%{min(parallelism or 1, completions)}"
        if spec.get("completionMode") == "Indexed":
            doc.warn("spec.completionMode", "Indexed: each task's index is GPUSCHED_ARRAY_INDEX "
                                            "(JOB_COMPLETION_INDEX is not set)")
    elif completions is None and parallelism is not None and parallelism > 1:
        t.array = f"0-{parallelism - 1}%{parallelism}"
        doc.warn("spec.parallelism", f"{parallelism} without completions (a work queue): {parallelism} tasks, each "
                                     "run to its end (Kubernetes ends the Job when one succeeds)")
    if t.array is not None and t.time_limit_s is not None:
        doc.warn("spec.activeDeadlineSeconds", "bounds each task's run (Kubernetes bounds the whole Job)")
    return t


def _pytorchjob(doc: Doc, spec: dict[str, Any], base: Template) -> Template | None:
    doc.rest(spec, "spec", {"pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"}, {},
             what="PyTorchJob field")
    rpath = "spec.pytorchReplicaSpecs"
    specs = doc.mapping(spec, "pytorchReplicaSpecs", "spec", required=True)
    for role in specs:
        if role not in PYTORCH_ROLES:
            doc.problem(at(rpath, str(role)), "not a replica type gpusched reads (a PyTorchJob has Master and Worker)")
    members: list[tuple[str, int, Template]] = []
    for role in PYTORCH_ROLES:
        if role not in specs:
            continue
        path = at(rpath, role)
        replica = doc.mapping(specs, role, rpath)
        doc.rest(replica, path, {"replicas", "template", "restartPolicy"}, {}, what="replica field")
        count = doc.integer(replica, "replicas", path, default=1) or 0
        if role == "Master" and count != 1:
            doc.problem(at(path, "replicas"), f"a PyTorchJob has one Master, got {count}")
        restart = doc.string(replica, "restartPolicy", path)
        if restart not in (None, "Never"):
            doc.warn(at(path, "restartPolicy"), f"{restart} ignored: a job runs once; gpusched does not restart it")
        t = _template(doc, replica, path, base)
        if t is not None and count:
            members.append((path, count, t))
    if not members:
        if not doc.problems:
            doc.problem(rpath, "no Master or Worker replicas to run")
        return None
    lead = members[0][2]
    lead.nodes = sum(count for _, count, _ in members)
    lead.main_container = "pytorch"
    lead.companions = [(path, t) for path, _, t in members[1:]]
    for _, t in lead.companions:
        t.main_container = "pytorch"
    elastic = doc.mapping(spec, "elasticPolicy", "spec")
    elastic_only = "gpusched runs a gang of a fixed size"
    doc.rest(elastic, "spec.elasticPolicy", {"nProcPerNode"}, {key: elastic_only for key in elastic}, what="field")
    nproc = spec.get("nprocPerNode", elastic.get("nProcPerNode"))
    if isinstance(nproc, int | str) and not isinstance(nproc, bool):
        lead.env["PET_NPROC_PER_NODE"] = str(nproc)
    elif nproc is not None:
        doc.wrong("spec.nprocPerNode", "an integer or auto, cpu or gpu", nproc)
    _run_policy(doc, spec, lead)
    return lead


def _run_policy(doc: Doc, spec: dict[str, Any], lead: Template) -> None:
    path = "spec.runPolicy"
    policy = doc.mapping(spec, "runPolicy", "spec")
    doc.rest(policy, path, {"activeDeadlineSeconds", "schedulingPolicy", "suspend"}, {
        "backoffLimit": _NO_RETRY, "ttlSecondsAfterFinished": _HISTORY,
        "cleanPodPolicy": "a gang's members all stop when it ends"}, what="run policy field")
    if doc.flag(policy, "suspend", path):
        doc.problem(at(path, "suspend"), f"not supported: {_SUSPENDED}")
    deadlines = [s for s in (lead.time_limit_s, doc.seconds(policy, "activeDeadlineSeconds", path)) if s is not None]
    lead.time_limit_s = min(deadlines) if deadlines else None
    scheduling = doc.mapping(policy, "schedulingPolicy", path)
    doc.rest(scheduling, at(path, "schedulingPolicy"), {"priorityClass"}, {
        "minAvailable": "a gang starts all its members or none", "queue": "a job waits in its tenant's queue",
        "scheduleTimeoutSeconds": "a gang waits until it can start"}, what="scheduling policy field")
    lead.priority_class = doc.string(scheduling, "priorityClass", at(path, "schedulingPolicy"))


def _jobset(doc: Doc, spec: dict[str, Any], base: Template) -> Template | None:
    doc.rest(spec, "spec", {"replicatedJobs", "suspend"}, {
        "network": "a gang's members find each other through MASTER_ADDR, not a headless service",
        "successPolicy": "a gang ends when its last member does", "failurePolicy": _NO_RETRY,
        "startupPolicy": "a gang's members start together", "ttlSecondsAfterFinished": _HISTORY,
        "coordinator": "rank 0 is MASTER_ADDR", "managedBy": "gpusched runs the job"}, what="JobSet field")
    if doc.flag(spec, "suspend", "spec"):
        doc.problem("spec.suspend", f"not supported: {_SUSPENDED}")
    jobs = doc.items(spec, "replicatedJobs", "spec", required=True)
    if len(jobs) != 1:
        names = ", ".join(str(job.get("name")) for _, job in jobs)
        if jobs or "replicatedJobs" in spec:
            doc.problem("spec.replicatedJobs", f"{len(jobs)} replicatedJobs{f' ({names})' if names else ''}: gpusched runs "
                                               "a JobSet as one gang of one replicatedJob; give each its own JobSet")
        return None
    path, replicated = jobs[0]
    doc.rest(replicated, path, {"name", "replicas", "template"}, {}, what="replicatedJob field")
    replicas = doc.integer(replicated, "replicas", path, minimum=1, default=1) or 1
    tpath = at(path, "template")
    template = doc.mapping(replicated, "template", path, required=True)
    doc.rest(template, tpath, {"metadata", "spec"}, {})
    _annotate(doc, base, doc.mapping(template, "metadata", tpath), at(tpath, "metadata"))
    job = doc.mapping(template, "spec", tpath, required=bool(template))
    if not job:
        return None
    t, completions, parallelism = _job_spec(doc, job, at(tpath, "spec"), base)
    if completions is not None and completions != (parallelism or 1):
        doc.problem(at(at(tpath, "spec"), "completions"), f"{completions}, parallelism {parallelism or 1}: gpusched runs "
                                                         "a JobSet's pods as one gang, each once (completions = parallelism)")
    if t is not None:
        t.nodes = replicas * (parallelism or 1)
    return t
