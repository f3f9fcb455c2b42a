"""Workload files on the command line: `gpusched submit -f FILE` (every job the file defines, each sent
to the gateway as its JobSpec), `gpusched submit -f FILE --dry-run [--json]` and `gpusched convert FILE
[-o yaml|json]` (what the file becomes, sending nothing: no gateway, no broker). The file is read by
``gpusched_core.workloads``: Pods, batch/v1 Jobs, PyTorchJobs, JobSets, one job per document."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpusched import job_body
from gpusched_common import events as ev
from gpusched_common.table import render
from gpusched_core.dependencies import parse_after
from gpusched_core.durations import parse_duration
from gpusched_core.submission import error_reasons
from gpusched_core.workloads import UNBOUND_TENANT, Workload, WorkloadError, read_workloads
from gpusched_core.workloads.yamlread import MAX_BYTES


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="show the JobSpecs a workload file (Pod, Job, PyTorchJob, JobSet) becomes; "
                                       "sends nothing")
    p.add_argument("file", metavar="FILE", help="a YAML file of one or more documents; `-` reads stdin")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("--tenant", help="the tenant to submit for (default: the file's metadata.namespace)")
    p.set_defaults(func=cmd_convert)


def read_file(name: str) -> bytes:
    """At most one byte more than a workload file may hold (the reader then says it is too large)."""
    if name == "-":
        return sys.stdin.buffer.read(MAX_BYTES + 1)
    with Path(name).open("rb") as handle:
        return handle.read(MAX_BYTES + 1)


def file_workloads(args: argparse.Namespace) -> list[Workload]:
    """The jobs of ``args.file`` with the flags that override a file: ``--tenant``, ``--priority``,
    ``--priority-class``, ``--time-limit``, ``--after``. WorkloadError with every problem (an unreadable
    file is one)."""
    try:
        data = read_file(args.file)
    except OSError as exc:
        raise WorkloadError([f"{args.file}: {exc.strerror or exc}"]) from None
    workloads = read_workloads(data, tenant=getattr(args, "tenant", None), priority=getattr(args, "priority", None),
                               tenant_required=False)
    update: dict[str, Any] = {}
    try:
        if getattr(args, "time_limit", None) is not None:
            update["time_limit_s"] = parse_duration(args.time_limit)
        if getattr(args, "after", None):
            update["after"] = [parse_after(a) for a in args.after]
        if getattr(args, "priority_class", None) is not None:
            update["priority_class"] = args.priority_class
    except ValueError as exc:
        raise WorkloadError([str(exc)]) from None
    return [replace(w, spec=w.spec.model_copy(update=update)) for w in workloads] if update else workloads


def flag_workload(spec: dict[str, Any], array: str | None) -> Workload:
    """The job the flags of `gpusched submit` ask for, as a dry run shows it."""
    try:
        return Workload(ev.JobSpec.model_validate({"tenant": UNBOUND_TENANT, **spec}), array, (), "flags")
    except ValidationError as exc:
        raise WorkloadError(list(error_reasons(exc))) from None


def submission(workload: Workload) -> dict[str, Any]:
    """The JobSpec as the gateway takes it (``gpusched.job_body``: what ``Client.submit_workloads`` sends)."""
    return job_body(workload)


def node_selector(pairs: list[str]) -> dict[str, str]:
    """``--selector KEY=VALUE`` (repeatable) as a node selector; ValueError for a pair that is not one, or
    a key given two values. Admission checks that each is a label name and value."""
    selector: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise ValueError(f"--selector {pair!r} is not KEY=VALUE, e.g. --selector zone=us-east-1a")
        if selector.get(key, value) != value:
            raise ValueError(f"--selector {key} is given twice ({selector[key]!r} and {value!r})")
        selector[key] = value
    return selector


def problems(command: str, error: WorkloadError) -> int:
    for problem in error.problems:
        print(f"gpusched {command}: {problem}", file=sys.stderr)
    return 2


def warn(command: str, workloads: list[Workload]) -> None:
    for workload in workloads:
        for warning in workload.warnings:
            print(f"gpusched {command}: warning: {workload.source}: {warning}", file=sys.stderr)


def show(workloads: list[Workload], form: str) -> str:
    """``json``/``yaml``: each job's source, JobSpec, array and warnings; ``table``: one line per job, then
    the warnings."""
    data = [w.as_dict() for w in workloads]
    if form == "json":
        return json.dumps(data, indent=2)
    if form == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1 << 16).rstrip()
    rows = [(w.source, w.spec.name, w.spec.tenant or "(yours)", _asks(w.spec), _runs(w.spec), w.array,
             f"{w.spec.time_limit_s:g}s" if w.spec.time_limit_s is not None else None) for w in workloads]
    text = render(["SOURCE", "NAME", "TENANT", "ASKS", "RUNS", "ARRAY", "LIMIT"], rows)
    warnings = [f"  {w.source}: {line}" for w in workloads for line in w.warnings]
    return text + ("\n\nwarnings:\n" + "\n".join(warnings) if warnings else "") + "\n\n(dry run: nothing was sent)"


def _asks(spec: ev.JobSpec) -> str:
    parts = [spec.describe()]
    if spec.cpu_milli:
        parts.append(f"cpu {spec.cpu_milli}m")
    if spec.memory_mib:
        parts.append(f"{spec.memory_mib} MiB")
    parts += [f"{k}={v}" for k, v in spec.node_selector.items()]
    if spec.priority_class or spec.priority:
        parts.append(f"priority {spec.priority_class or spec.priority}")
    return ", ".join(parts)


def _runs(spec: ev.JobSpec) -> str:
    entrypoint = " ".join(["(its entrypoint)", *getattr(spec, "args", ())])
    command = " ".join(spec.command) if spec.command else entrypoint if spec.image else ""
    text = f"{spec.image}: {command}" if spec.image else command
    return text if len(text) <= 60 else text[:57] + "..."


def cmd_convert(args: argparse.Namespace) -> int:
    try:
        workloads = file_workloads(args)
    except WorkloadError as exc:
        return problems("convert", exc)
    print(show(workloads, args.output))
    return 0
