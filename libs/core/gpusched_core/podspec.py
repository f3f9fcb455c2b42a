"""One Kubernetes workload as one job (pure): what the gateway's ``POST /v1/jobs`` takes as YAML, through
``gpusched_core.workloads`` (which reads every kind, document and field: see there). ``spec_from_pod_yaml``
gives the JobSpec of a file that defines exactly one job, ``pod_array`` its array expression."""

from __future__ import annotations

from gpusched_common import events as ev

from gpusched_core.workloads import Workload, WorkloadError, read_workloads
from gpusched_core.workloads.pod import (AFTER_ANNOTATION, ARRAY_ANNOTATION, GANG_ANNOTATION, GPU_RESOURCE,
                                         MIG_RESOURCE_PREFIX, PRODUCT_LABEL, SHARE_ANNOTATION,
                                         SHARE_MEMORY_ANNOTATION)
from gpusched_core.workloads.quantities import QuantityError, cpu_milli as _cpu_milli, memory_mib as _memory_mib

__all__ = ["AFTER_ANNOTATION", "ARRAY_ANNOTATION", "GANG_ANNOTATION", "GPU_RESOURCE", "MIG_RESOURCE_PREFIX",
           "PRODUCT_LABEL", "SHARE_ANNOTATION", "SHARE_MEMORY_ANNOTATION", "PodSpecError", "cpu_milli",
           "memory_mib", "one_workload", "pod_array", "spec_from_pod_yaml"]

PodSpecError = WorkloadError


def cpu_milli(quantity: object) -> int:
    """A Kubernetes CPU quantity (``2``, ``4.03``, ``500m``) in milli-cores, rounded up; PodSpecError."""
    try:
        return _cpu_milli(quantity)
    except QuantityError as exc:
        raise PodSpecError([f"cpu: {exc}"]) from None


def memory_mib(quantity: object) -> int:
    """A Kubernetes memory quantity (``64Gi``, ``1G``, ``129e6``) in MiB, rounded up; PodSpecError."""
    try:
        return _memory_mib(quantity)
    except QuantityError as exc:
        raise PodSpecError([f"memory: {exc}"]) from None


def one_workload(text: str | bytes, *, tenant: str | None = None, priority: int | None = None) -> Workload:
    """The one job of a file; PodSpecError with every problem, or when it defines several jobs."""
    workloads = read_workloads(text, tenant=tenant, priority=priority)
    if len(workloads) > 1:
        raise PodSpecError([f"the file defines {len(workloads)} jobs ({', '.join(w.source for w in workloads)}); "
                            "one is taken here: submit the file with `gpusched submit -f`, which sends each"])
    return workloads[0]


def spec_from_pod_yaml(text: str | bytes, *, tenant: str | None = None, priority: int | None = None) -> ev.JobSpec:
    return one_workload(text, tenant=tenant, priority=priority).spec


def pod_array(text: str | bytes) -> str | None:
    """The array a one-job file asks for (``gpusched.io/array: "0-99%8"``, a Job's completions), None
    without one or when it cannot be read (``spec_from_pod_yaml`` says why)."""
    try:
        return one_workload(text, tenant="-").array
    except PodSpecError:
        return None
