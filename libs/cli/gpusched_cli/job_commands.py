"""`gpusched submit | jobs | queue | job`: submit a job and read where jobs stand."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.settings import Settings
from gpusched_common.table import render

from gpusched_cli import stack


def add_job_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job: flags and `-- command...`, or -f pod.yaml")
    p.add_argument("--tenant")
    p.add_argument("--gpus", type=int, default=1, help="whole GPUs (per node for a gang)")
    p.add_argument("--gpu-model")
    p.add_argument("--nodes", type=int, default=1, help="a gang: this many nodes of --gpus each, all or nothing")
    p.add_argument("--gpu-share", type=float, metavar="FRACTION", help="a fraction of one GPU, e.g. 0.25")
    p.add_argument("--gpu-memory-mib", type=int, help="GPU memory reserved with --gpu-share")
    p.add_argument("--mig", metavar="PROFILE", help="one MIG slice, e.g. 3g.40gb")
    p.add_argument("--cpu", metavar="QUANTITY", help="host CPU per node, e.g. 8 or 500m")
    p.add_argument("--memory", metavar="QUANTITY", help="host memory per node, e.g. 64Gi")
    p.add_argument("--priority", type=int)
    p.add_argument("--name")
    p.add_argument("--request-id", help="idempotency key: repeating a request creates no second job")
    p.add_argument("-f", "--file", help="a Kubernetes pod spec (YAML); `-` reads stdin")
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", help="list jobs")
    p.add_argument("--state")
    p.add_argument("--tenant")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("queue", help="waiting jobs in order, with their position and why they wait")
    p.add_argument("--tenant")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_queue)

    p = sub.add_parser("job", help="a job's state and event history")
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)


def _settings() -> Settings:
    """Settings from the environment, pointed at the local stack when one is up and nothing is set."""
    state = stack.load()
    if state is not None:
        os.environ.setdefault("GPUSCHED_DATABASE_URL", state.database_url)
        os.environ.setdefault("GPUSCHED_KAFKA_BOOTSTRAP", state.kafka_bootstrap)
        if "GPUSCHED_TENANT_KEYS_FILE" in state.env:
            os.environ.setdefault("GPUSCHED_TENANT_KEYS_FILE", state.env["GPUSCHED_TENANT_KEYS_FILE"])
    return Settings()


def _print(data: object, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if as_json else text)


def _print(data: object, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if as_json else text)


def build_spec(args: argparse.Namespace) -> ev.JobSpec:
    from gpusched_core.podspec import cpu_milli, memory_mib, spec_from_pod_yaml

    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        return spec_from_pod_yaml(text, tenant=args.tenant, priority=args.priority)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.tenant:
        raise ValueError("--tenant is required")
    share = None
    if args.gpu_share is not None:
        share = ev.GpuShareSpec(milli=round(args.gpu_share * 1000), memory_mib=args.gpu_memory_mib or 0)
    elif args.gpu_memory_mib is not None:
        raise ValueError("--gpu-memory-mib goes with --gpu-share")
    return ev.JobSpec(tenant=args.tenant, gpus=args.gpus, gpu_model=args.gpu_model, priority=args.priority or 0,
                      command=command, name=args.name, nodes=args.nodes, gpu_share=share, mig_profile=args.mig,
                      cpu_milli=cpu_milli(args.cpu) if args.cpu is not None else 0,
                      memory_mib=memory_mib(args.memory) if args.memory is not None else 0)


def cmd_submit(args: argparse.Namespace) -> int:
    from gpusched_cli.client import Client

    try:
        spec = build_spec(args)
    except (ValueError, ValidationError, OSError) as exc:
        print(f"gpusched submit: {exc}", file=sys.stderr)
        return 2

    async def go() -> str:
        async with Client(_settings()) as client:
            return await client.submit(spec, request_id=args.request_id)

    job_id = asyncio.run(go())
    _print({"job_id": job_id, "spec": spec.model_dump()}, args.json, f"submitted {job_id}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from gpusched_cli.queries import list_jobs

    async def go():
        conn = await connect(_settings().database_url)
        try:
            return await list_jobs(conn, status=args.state, tenant=args.tenant, limit=args.limit)
        finally:
            await conn.close()

    jobs = asyncio.run(go())
    rows = [(j["job_id"], j["tenant"], j["status"], j["gpus"], j["gpu_model"], j["node_id"], j["exit_code"],
             "; ".join(j["reasons"])[:60]) for j in jobs]
    _print(jobs, args.json, render(["JOB", "TENANT", "STATE", "GPUS", "MODEL", "NODE", "EXIT", "REASON"], rows))
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    from gpusched_cli.queries import queue

    async def go():
        conn = await connect(_settings().database_url)
        try:
            return await queue(conn, tenant=args.tenant)
        finally:
            await conn.close()

    jobs = asyncio.run(go())
    rows = [(j["queue"], j["position"] or "-", j["job_id"], j["tenant"], j["priority"], j["gpus"], j["gpu_model"],
             (f"behind {j['ahead_higher_priority']} of higher priority; " if j["ahead_higher_priority"] else "")
             + j["reason"]) for j in jobs]
    _print(jobs, args.json, render(["QUEUE", "#", "JOB", "TENANT", "PRIO", "GPUS", "MODEL", "WHY"], rows))
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    from gpusched_cli.queries import get_job

    async def go():
        conn = await connect(_settings().database_url)
        try:
            return await get_job(conn, args.job_id)
        finally:
            await conn.close()

    job = asyncio.run(go())
    if job is None:
        print(f"gpusched job: no job {args.job_id}", file=sys.stderr)
        return 1
    head = render(["FIELD", "VALUE"], [(k, job[k]["describe"] if k == "waiting" else job[k])
                                       for k in job if k != "events"])
    history = render(["#", "EVENT", "BY", "AT", "DETAIL"],
                     [(e["version"], e["type"], e["producer"], e["occurred_at"], _detail(e)) for e in job["events"]])
    _print(job, args.json, f"{head}\n\n{history}")
    return 0


def where(placed: dict) -> str:
    """``n1 GPUs [0, 1]``; a gang ``n1 GPUs [0..7] + n2 GPUs [0..7]``; ``n1 GPU 3 (250 milli, 8192 MiB)``;
    ``n1 GPU 0 MIG 3g.40gb@4``."""
    members = placed.get("members") or [placed]
    text = " + ".join(f"{m['node_id']} GPUs {m['gpu_indices']}" for m in members)
    if placed.get("gpu_share_milli"):
        memory = f", {placed['gpu_memory_mib']} MiB" if placed.get("gpu_memory_mib") else ""
        return f"{placed['node_id']} GPU {placed['gpu_indices'][0]} ({placed['gpu_share_milli']} milli{memory})"
    if placed.get("mig_profile"):
        return f"{placed['node_id']} GPU {placed['gpu_indices'][0]} MIG {placed['mig_profile']}@{placed['mig_start']}"
    return text


def _detail(event: dict) -> str:
    payload = event["payload"]
    if "gpu_indices" in payload and payload.get("node_id"):  # where it runs first, then why
        return f"{where(payload)}: {payload.get('reason', '')}"[:100]
    for key in ("reasons", "reason", "node_id", "exit_code"):
        if key in payload and payload[key] not in (None, []):
            value = payload[key]
            text = "; ".join(value) if isinstance(value, list) else str(value)
            return f"{key}: {text}"[:100]
    return ""
