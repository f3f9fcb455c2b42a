"""A pod template as the fields of a JobSpec (pure). What runs is one container (the first; a
PyTorchJob's ``pytorch``): its ``image``, ``command`` + ``args`` and ``env`` values. Resources are summed
over the containers, as Kubernetes schedules a pod: ``nvidia.com/gpu`` and ``nvidia.com/mig-<profile>``
limits (requests when a container has no limit), host ``cpu`` and ``memory`` requests (limits when a
container has no request). The node must carry the labels of ``nodeSelector`` and of the required node
affinity (one term of ``In`` expressions with one value each); ``nvidia.com/gpu.product`` is the GPU model.
gpusched annotations ask for a gang, a share of a GPU, an array and dependencies. Every field read and not
acted on is a warning; what cannot be honoured is a problem."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpusched_core.dependencies import parse_after
from gpusched_core.workloads.quantities import MIB, QuantityError, ceil, parse_quantity, whole_count
from gpusched_core.workloads.reading import Doc, at

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GANG_ANNOTATION = "gpusched.io/gang-nodes"
SHARE_ANNOTATION = "gpusched.io/gpu-share-milli"
SHARE_MEMORY_ANNOTATION = "gpusched.io/gpu-memory-mib"
ARRAY_ANNOTATION = "gpusched.io/array"  # a job array: "0-99%8"
AFTER_ANNOTATION = "gpusched.io/after"  # dependencies: "j-1:ok,j-2:any"

_NO_VOLUMES = "gpusched mounts no volumes"
_RUNS_ONCE = "a job runs once; gpusched does not restart it"
_AS_AGENT = "the job runs as its node agent's user, with no added privileges"
_NODE_NET = "a job uses its node's network, name and DNS"
_NO_ACCOUNT = "a job gets no Kubernetes service account"
POD_READ = frozenset({"containers", "nodeSelector", "affinity", "priority", "priorityClassName",
                      "activeDeadlineSeconds", "restartPolicy"})
POD_IGNORED = {
    "tolerations": "gpusched does not taint nodes", "volumes": _NO_VOLUMES, "securityContext": _AS_AGENT,
    "initContainers": "gpusched runs no init containers", "hostNetwork": _NODE_NET, "hostIPC": _NODE_NET,
    "hostPID": _NODE_NET, "dnsPolicy": _NODE_NET, "dnsConfig": _NODE_NET, "hostname": _NODE_NET,
    "subdomain": _NODE_NET, "hostAliases": _NODE_NET, "setHostnameAsFQDN": _NODE_NET,
    "enableServiceLinks": _NODE_NET, "serviceAccountName": _NO_ACCOUNT, "serviceAccount": _NO_ACCOUNT,
    "automountServiceAccountToken": _NO_ACCOUNT,
    "imagePullSecrets": "the node's container runtime pulls with its own credentials",
    "schedulerName": "gpusched is the scheduler", "runtimeClassName": "the node agent chooses the container runtime",
    "terminationGracePeriodSeconds": "the node agent's grace applies (SIGTERM, then SIGKILL)",
    "topologySpreadConstraints": "gpusched's placement policy decides the spread",
    "preemptionPolicy": "preemption follows the tenancy's priority classes",
}
POD_REFUSED = {"nodeName": "a pod bound to a named node: select the node by its labels with nodeSelector",
               "resourceClaims": "dynamic resource claims: ask for GPUs with nvidia.com/gpu limits"}
CONTAINER_READ = frozenset({"name", "image", "command", "args", "env", "resources"})
CONTAINER_IGNORED = {
    "volumeMounts": _NO_VOLUMES, "volumeDevices": _NO_VOLUMES, "securityContext": _AS_AGENT,
    "ports": "a job's ports are its node's: nothing is exposed or forwarded",
    "livenessProbe": "gpusched runs no probes", "readinessProbe": "gpusched runs no probes",
    "startupProbe": "gpusched runs no probes", "lifecycle": "gpusched runs no lifecycle hooks",
    "imagePullPolicy": "the node's container runtime pulls as it is configured",
    "workingDir": "the job starts in the work directory its node agent gives it",
    "stdin": "a job has no terminal: its output is its log", "stdinOnce": "a job has no terminal: its output is its log",
    "tty": "a job has no terminal: its output is its log", "terminationMessagePath": "a job's output is its log",
    "terminationMessagePolicy": "a job's output is its log", "resizePolicy": "a run's resources are fixed",
    "restartPolicy": _RUNS_ONCE,
}
CONTAINER_REFUSED = {"envFrom": "variables from a ConfigMap or Secret: set each with name and value"}


@dataclass
class Template:
    """A pod template and what its kind adds: a gang's size, an array, a time limit, variables."""

    pod: dict[str, Any]
    path: str  # of the pod spec in the document: "spec", "spec.template.spec"
    name: str | None = None
    namespace: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)  # the object's, then the templates'
    annotation_paths: dict[str, str] = field(default_factory=dict)  # where each was given
    nodes: int | None = None
    array: str | None = None
    time_limit_s: float | None = None
    priority_class: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    main_container: str | None = None  # the container to run, by name (else the first)
    companions: list[tuple[str, Template]] = field(default_factory=list)  # other replicas: the same asks

    def where(self, key: str) -> str:
        return self.annotation_paths.get(key) or at("metadata.annotations", key)


@dataclass
class Resources:
    gpus: int = 0
    migs: dict[str, int] = field(default_factory=dict)
    cpu: Decimal = Decimal(0)  # cores, exactly
    memory: Decimal = Decimal(0)  # bytes, exactly


def job_fields(doc: Doc, t: Template) -> dict[str, Any]:
    """The JobSpec fields of a template (but ``tenant``); problems and warnings go to ``doc``."""
    pod, path = t.pod, t.path
    doc.rest(pod, path, POD_READ, POD_IGNORED, POD_REFUSED, what="pod field")
    restart = doc.string(pod, "restartPolicy", path)
    if restart not in (None, "Never"):
        doc.warn(at(path, "restartPolicy"), f"{restart} ignored: {_RUNS_ONCE}")
    containers = doc.items(pod, "containers", path)
    if not containers:
        if pod.get("containers") in (None, []):
            doc.problem(at(path, "containers"), "the pod has no containers")
        return {}
    names = [c.get("name") for _, c in containers]
    main = names.index(t.main_container) if t.main_container in names else 0
    total = Resources()
    for index, (cpath, container) in enumerate(containers):
        own = resources(doc, container, cpath)
        total.gpus += own.gpus
        total.cpu += own.cpu
        total.memory += own.memory
        for profile, count in own.migs.items():
            total.migs[profile] = total.migs.get(profile, 0) + count
        if index != main:
            doc.warn(cpath, f"not run: gpusched runs one container per job ({containers[main][0]}); "
                            "its resource requests are counted")
    fields = _run(doc, *containers[main])
    fields["env"] = {**t.env, **fields["env"]}
    selector = node_selector(doc, pod, path)
    annotations = t.annotations
    share = None
    if SHARE_ANNOTATION in annotations:
        share = {"milli": _annotation_int(doc, t, SHARE_ANNOTATION, 0),
                 "memory_mib": _annotation_int(doc, t, SHARE_MEMORY_ANNOTATION, 0)}
    elif SHARE_MEMORY_ANNOTATION in annotations:
        doc.problem(t.where(SHARE_MEMORY_ANNOTATION), f"goes with {SHARE_ANNOTATION}")
    nodes = _annotation_int(doc, t, GANG_ANNOTATION, 1) if GANG_ANNOTATION in annotations else None
    if nodes is not None and t.nodes is not None and nodes != t.nodes:
        doc.problem(t.where(GANG_ANNOTATION), f"{nodes} nodes, but the replicas make a gang of {t.nodes}")
    mig = _mig(doc, total, path)
    priority = doc.integer(pod, "priority", path, minimum=-(2**31))
    deadlines = [s for s in (doc.seconds(pod, "activeDeadlineSeconds", path), t.time_limit_s) if s is not None]
    fields.update(
        gpus=max(total.gpus, 1) if (mig or share) else total.gpus, gpu_model=selector.pop(PRODUCT_LABEL, None),
        node_selector=selector, nodes=t.nodes or nodes or 1, gpu_share=share, mig_profile=mig,
        cpu_milli=ceil(total.cpu * 1000), memory_mib=ceil(total.memory / MIB), priority=priority or 0,
        priority_class=doc.string(pod, "priorityClassName", path) or t.priority_class,
        time_limit_s=min(deadlines) if deadlines else None, name=t.name, after=_after(doc, t))
    return fields


def array_of(doc: Doc, t: Template) -> str | None:
    """The job array the template asks for: its kind's (a Job's completions) or the annotation's."""
    value = t.annotations.get(ARRAY_ANNOTATION)
    if value is not None and not isinstance(value, str | int):
        doc.wrong(t.where(ARRAY_ANNOTATION), "a string", value)
        return t.array
    if value is not None and t.array is not None:
        doc.problem(t.where(ARRAY_ANNOTATION), f"{value}, but the Job's completions make the array {t.array}")
    return t.array or (None if value is None else str(value))


def _run(doc: Doc, cpath: str, container: dict[str, Any]) -> dict[str, Any]:
    """What runs: the image, the command (with its args) and the variables of the container."""
    doc.rest(container, cpath, CONTAINER_READ, CONTAINER_IGNORED, CONTAINER_REFUSED, what="container field")
    image = doc.string(container, "image", cpath)
    command, args = doc.strings(container, "command", cpath), doc.strings(container, "args", cpath)
    if image is None and args and not command:
        doc.problem(at(cpath, "args"), "args without command or image: give the command the args are for")
    elif not command and not args and container.get("image") is None:
        doc.problem(cpath, "no command and no image: give command (a process on the node) or image (its entrypoint runs)")
    env: dict[str, str] = {}
    for epath, item in doc.items(container, "env", cpath):
        doc.rest(item, epath, {"name", "value"}, {}, {
            "valueFrom": "values from a Secret, a ConfigMap or the pod's fields: give the value"})
        name, value = doc.string(item, "name", epath, required=True), doc.string(item, "value", epath)
        if name is not None:
            if name in env:
                doc.warn(at(epath, "name"), f"{name} is set twice: the last value is kept")
            env[name] = value or ""
    if image is not None and args and not command:  # the image's entrypoint, with these arguments
        return {"image": image, "command": [], "args": args, "env": env}
    return {"image": image, "command": command + args, "env": env}


def resources(doc: Doc, container: dict[str, Any], cpath: str) -> Resources:
    """One container's GPUs, MIG slices, host CPU and memory."""
    rpath = at(cpath, "resources")
    spec = doc.mapping(container, "resources", cpath)
    doc.rest(spec, rpath, {"limits", "requests"}, {}, {"claims": "dynamic resource claims: ask for GPUs with "
                                                                 "nvidia.com/gpu limits"}, what="resources field")
    limits, requests = doc.mapping(spec, "limits", rpath), doc.mapping(spec, "requests", rpath)
    out = Resources()
    for name in dict.fromkeys([*requests, *limits]):
        if not isinstance(name, str):
            doc.problem(rpath, f"resource name {name!r} is not a string")
            continue
        first, second = ("requests", "limits") if name in ("cpu", "memory") else ("limits", "requests")
        source = first if name in (requests if first == "requests" else limits) else second
        value = (requests if source == "requests" else limits)[name]
        where = at(at(rpath, source), name)
        try:
            if name == "cpu":
                out.cpu = parse_quantity(value)
            elif name == "memory":
                out.memory = parse_quantity(value)
            elif name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
                count = whole_count(value)
                if name in requests and name in limits and whole_count(requests[name]) != count:
                    doc.problem(where, f"the request ({requests[name]}) and the limit ({limits[name]}) of {name} differ")
                if name == GPU_RESOURCE:
                    out.gpus = count
                elif count:
                    out.migs[name[len(MIG_RESOURCE_PREFIX):]] = count
            elif name == "ephemeral-storage" or name.startswith("hugepages-"):
                doc.warn(where, f"ignored: gpusched does not reserve {name}")
            else:
                doc.problem(where, f"gpusched does not schedule {name} (it schedules {GPU_RESOURCE}, "
                                   f"{MIG_RESOURCE_PREFIX}<profile>, cpu and memory)")
        except QuantityError as exc:
            doc.problem(where, str(exc))
    return out


def node_selector(doc: Doc, pod: dict[str, Any], path: str) -> dict[str, str]:
    """``nodeSelector`` and the required node affinity: the labels every node of the job must carry."""
    selector = doc.labels(pod, "nodeSelector", path)
    apath = at(path, "affinity")
    affinity = doc.mapping(pod, "affinity", path)
    doc.rest(affinity, apath, {"nodeAffinity"}, {
        "podAffinity": "gpusched places no job by the pods of others",
        "podAntiAffinity": "gpusched places no job by the pods of others (a gang's members each get a node)"})
    npath = at(apath, "nodeAffinity")
    node = doc.mapping(affinity, "nodeAffinity", apath)
    doc.rest(node, npath, {"requiredDuringSchedulingIgnoredDuringExecution"}, {
        "preferredDuringSchedulingIgnoredDuringExecution": "gpusched takes no soft node preference (a requirement "
                                                           "is nodeSelector or required node affinity)"})
    rpath = at(npath, "requiredDuringSchedulingIgnoredDuringExecution")
    required = doc.mapping(node, "requiredDuringSchedulingIgnoredDuringExecution", npath)
    doc.rest(required, rpath, {"nodeSelectorTerms"}, {})
    terms = doc.items(required, "nodeSelectorTerms", rpath)
    if len(terms) > 1:
        doc.problem(at(rpath, "nodeSelectorTerms"), f"{len(terms)} terms (a node matching any one): gpusched takes "
                                                    "one term, whose expressions every node must match")
    for tpath, term in terms[:1]:
        doc.rest(term, tpath, {"matchExpressions"}, {}, {"matchFields": "selecting nodes by field: select them by "
                                                                        "label with matchExpressions"})
        for epath, expression in doc.items(term, "matchExpressions", tpath):
            doc.rest(expression, epath, {"key", "operator", "values"}, {})
            key = doc.string(expression, "key", epath, required=True)
            operator = doc.string(expression, "operator", epath, required=True)
            values = doc.strings(expression, "values", epath)
            if key is None or operator is None:
                continue
            if operator != "In":
                doc.problem(at(epath, "operator"), f"{key} {operator}: gpusched takes only In with one value "
                                                   "(a label every node must carry)")
            elif len(values) != 1:
                doc.problem(at(epath, "values"), f"{key} In {len(values)} values: gpusched takes exactly one "
                                                 "value (a label every node must carry)")
            elif selector.get(key, values[0]) != values[0]:
                doc.problem(at(epath, "values"), f"{key} must be {values[0]!r} and {selector[key]!r}: no node can be both")
            else:
                selector[key] = values[0]
    return selector


def _mig(doc: Doc, total: Resources, path: str) -> str | None:
    if not total.migs:
        return None
    asked = [f"{MIG_RESOURCE_PREFIX}{p}: {n}" for p, n in total.migs.items()]
    if len(total.migs) > 1 or total.gpus:
        doc.problem(at(path, "containers"), f"a job asks for one MIG slice or whole GPUs, got "
                                            f"{', '.join([*asked, *([f'{GPU_RESOURCE}: {total.gpus}'] if total.gpus else [])])}")
    elif sum(total.migs.values()) > 1:
        doc.problem(at(path, "containers"), f"a job asks for one MIG slice, got {asked[0]}")
    return next(iter(total.migs))


def _annotation_int(doc: Doc, t: Template, key: str, default: int) -> int:
    value = t.annotations.get(key)
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    doc.problem(t.where(key), f"must be an integer, got {value!r}")
    return default


def _after(doc: Doc, t: Template) -> list[Any]:
    """``gpusched.io/after: "j-1:ok,j-2:any"``: the jobs to wait for."""
    value = t.annotations.get(AFTER_ANNOTATION)
    if value is None:
        return []
    try:
        return [parse_after(part) for part in str(value).split(",") if part.strip()]
    except ValueError as exc:
        doc.problem(t.where(AFTER_ANNOTATION), str(exc))
        return []
