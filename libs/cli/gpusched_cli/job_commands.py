"""`gpusched submit | convert | jobs | job | queue | cancel | hold | release | watch`: submit jobs and read where they stand, through the gateway
(``gpusched.Client``; the server and token come from GPUSCHED_SERVER/GPUSCHED_TOKEN or the config file
that `gpusched up` writes). None of these commands holds a database or broker credential."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gpusched import ApiError, Client, NoServer
from gpusched_common.table import render
from gpusched_core.durations import parse_duration
from gpusched_core.dependencies import parse_after
from gpusched_core.podspec import PodSpecError, cpu_milli, memory_mib
from gpusched_core.workloads import WorkloadError

from gpusched_cli import check, estimates
from gpusched_cli.job_files import (add_convert_parser, file_workloads, flag_workload, node_selector, problems, show,
                                    submission, warn)

FINISHED = ("Succeeded", "Failed", "Cancelled", "Rejected")


def add_job_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a job: flags and `-- command...`, or -f FILE (Pods, Jobs, PyTorchJobs, "
                                      "JobSets: every job of the file)")
    p.add_argument("--tenant", help="the tenant to submit for (default: the one your token is bound to)")
    p.add_argument("--gpus", type=int, default=1, help="whole GPUs (per node for a gang)")
    p.add_argument("--gpu-model")
    p.add_argument("--nodes", type=int, default=1, help="a gang: this many nodes of --gpus each, all or nothing")
    p.add_argument("--gpu-share", type=float, metavar="FRACTION", help="a fraction of one GPU, e.g. 0.25")
    p.add_argument("--gpu-memory-mib", type=int, help="GPU memory reserved with --gpu-share")
    p.add_argument("--mig", metavar="PROFILE", help="one MIG slice, e.g. 3g.40gb")
    p.add_argument("--cpu", metavar="QUANTITY", help="host CPU per node, e.g. 8 or 500m")
    p.add_argument("--memory", metavar="QUANTITY", help="host memory per node, e.g. 64Gi")
    p.add_argument("--priority", type=int)
    p.add_argument("--priority-class", metavar="NAME", help="a priority class of the tenancy (sets the priority)")
    p.add_argument("--image", help="run in a container of IMAGE; with no command, its entrypoint")
    p.add_argument("--arg", action="append", default=[], dest="entrypoint_args", metavar="VALUE",
                   help="an argument of the image's entrypoint (--image, no command); repeatable; --arg=-v")
    p.add_argument("--selector", action="append", default=[], metavar="KEY=VALUE",
                   help="a label every node of the job must carry; repeatable")
    p.add_argument("--name")
    p.add_argument("--request-id", help="idempotency key: repeating a request creates no second job")
    p.add_argument("-f", "--file", help="a workload file (YAML, one job per document); `-` reads stdin")
    p.add_argument("--dry-run", action="store_true", help="show the JobSpec of each job it would submit; send nothing")
    p.add_argument("--check", action="store_true", help=check.HELP)
    p.add_argument("--time-limit", metavar="DURATION", help="stop the job after this long, e.g. 90m, 2h, 3600")
    p.add_argument("--hold", action="store_true", help="submit held: it waits for `gpusched release`")
    p.add_argument("--array", metavar="INDICES", help="a job array: 0-99, 1,3,5-7 or 0-20:5; %%8 runs at most 8 "
                   "at once (each task gets GPUSCHED_ARRAY_INDEX)")
    p.add_argument("--after", action="append", default=[], metavar="JOB[:ok|:any]",
                   help="wait for JOB to succeed (:ok, the default) or to end (:any); repeatable")
    p.add_argument("--wait", action="store_true", help="follow the job and exit with its exit code (like srun)")
    p.add_argument("--json", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_submit)
    add_convert_parser(sub)

    p = sub.add_parser("watch", help="follow a job's events until it ends; exit with its exit code")
    p.add_argument("job_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_watch)

    for verb, text in (("hold", "set waiting jobs aside: quota and placement leave them until released"),
                       ("release", "put held jobs back in line at their original submission time")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("job_ids", nargs="+", metavar="JOB")
        if verb == "hold":
            p.add_argument("--reason", help="why, recorded with the hold")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_hold if verb == "hold" else cmd_release)

    p = sub.add_parser("jobs", help="list jobs (newest first)")
    p.add_argument("--state")
    p.add_argument("--tenant")
    p.add_argument("--name")
    p.add_argument("--since", help="submitted at or after (ISO 8601 with a zone, e.g. 2026-12-01T00:00:00Z)")
    p.add_argument("--until", help="submitted before (ISO 8601 with a zone)")
    p.add_argument("--array", metavar="ARRAY", help="the tasks of this job array, in index order")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("queue", help="waiting jobs in order, with their position and why they wait")
    p.add_argument("--tenant")
    p.add_argument("--start", action="store_true", help="add each job's estimated start (like squeue --start)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_queue)

    p = sub.add_parser("job", help="a job's state and event history")
    p.add_argument("job_id")
    p.add_argument("--follow", action="store_true", help="print its events as they happen, until it ends")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("cancel", help="cancel jobs: by id, or every job of --tenant/--state")
    p.add_argument("job_ids", nargs="*", metavar="JOB")
    p.add_argument("--tenant", help="with no JOB: the tenant's jobs (yours by default)")
    p.add_argument("--state", help="with no JOB: only jobs in this state (e.g. Admitted)")
    p.add_argument("--reason", help="why, recorded with the cancellation")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cancel)


def output(data: object, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if as_json else text)


def through_gateway(command: str, work: Callable[[Client], int]) -> int:
    """Run ``work`` with a client of the configured gateway; its refusals become a message (and every
    reason), not a traceback: exit 1, or 2 for a request the gateway calls invalid."""
    try:
        with Client.from_config() as client:
            return work(client)
    except NoServer as exc:
        print(f"gpusched {command}: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"gpusched {command}: {exc.detail}" + (f" (HTTP {exc.status})" if exc.status else ""), file=sys.stderr)
        for reason in exc.reasons if len(exc.reasons) > 1 else []:
            print(f"  - {reason}", file=sys.stderr)
        return 2 if exc.status in (400, 413, 415, 422) else 1


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """A JobSpec as a dict from the flags; ValueError when they cannot make one. The gateway checks the
    rest (and says why)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.entrypoint_args and (args.image is None or command):
        raise ValueError("--arg is an argument of the image's entrypoint: " + (
            "with a command, put it in the command" if command else "give an --image"))
    if not command and args.image is None:
        raise ValueError("give the command after --, e.g. gpusched submit --gpus 1 -- python train.py (or an "
                         "--image, to run its entrypoint)")
    if args.gpu_memory_mib is not None and args.gpu_share is None:
        raise ValueError("--gpu-memory-mib goes with --gpu-share")
    spec: dict[str, Any] = {"gpus": args.gpus, "nodes": args.nodes, "command": command}
    optional = {"tenant": args.tenant, "gpu_model": args.gpu_model, "priority": args.priority, "name": args.name,
                "mig_profile": args.mig, "image": args.image, "priority_class": args.priority_class,
                "args": args.entrypoint_args or None, "node_selector": node_selector(args.selector) or None,
                "cpu_milli": cpu_milli(args.cpu) if args.cpu is not None else None,
                "memory_mib": memory_mib(args.memory) if args.memory is not None else None,
                "time_limit_s": parse_duration(args.time_limit) if args.time_limit is not None else None,
                "gpu_share": {"milli": round(args.gpu_share * 1000), "memory_mib": args.gpu_memory_mib or 0}
                if args.gpu_share is not None else None,
                "after": [parse_after(a).model_dump() for a in args.after] or None}
    spec.update({k: v for k, v in optional.items() if v is not None})
    return spec


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit the job of the flags, or every job of ``-f FILE`` (each its JobSpec, in order; a failure stops
    the rest: submitting again with the same --request-id replays those that went); --dry-run shows them."""
    try:
        if args.file:
            if args.image is not None or args.entrypoint_args or args.selector:
                raise ValueError("--image, --arg and --selector describe the job of the flags; with -f the file "
                                 "does (its image, args and nodeSelector)")
            shown = file_workloads(args)
            jobs = [(submission(w), args.array or w.array) for w in shown]
        else:
            jobs = [(build_request(args), args.array)]
            shown = [flag_workload(*jobs[0])] if args.dry_run else []
    except WorkloadError as exc:
        return problems("submit", exc)
    except (ValueError, PodSpecError, OSError) as exc:
        print(f"gpusched submit: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(show(shown, "json" if args.json else "table"))
        return 0
    warn("submit", shown)
    if args.check:
        return through_gateway("submit --check", lambda client: check.check_jobs(client, [b for b, _ in jobs], args.json))
    if args.wait and len(jobs) > 1:
        print(f"gpusched submit: --wait follows one job; {args.file} defines {len(jobs)}", file=sys.stderr)
        return 2

    def work(client: Client) -> int:
        for index, (body, array) in enumerate(jobs):
            key = args.request_id if args.request_id is None or len(jobs) == 1 else f"{args.request_id}.{index}"
            job = client.submit(body, idempotency_key=key, hold=args.hold, array=array)
            if args.wait:
                return _submitted(client, args, job)
            _submitted(client, args, job)
        return 0

    return through_gateway("submit", work)


def _submitted(client: Client, args: argparse.Namespace, job: dict[str, Any]) -> int:
    """Say what the gateway answered for one job (an array: its tasks); --wait: follow it."""
    again = " (already submitted with this request id)" if job.get("replayed") else ""
    if "array_id" in job:
        if args.wait:
            print("gpusched submit: --wait follows one job; follow the array with "
                  f"`gpusched jobs --array {job['array_id']}`", file=sys.stderr)
        output(job, args.json, f"submitted array {job['array_id']} for tenant {job['tenant']}: {job['tasks']} "
               f"tasks ({job['indices']}), jobs {job['array_id']}.<index>{again}")
        return 0
    if args.wait:
        print(f"submitted {job['job_id']} for tenant {job['tenant']}{again}; following it", file=sys.stderr)
        return _follow(client, job["job_id"], args.json)
    output(job, args.json, f"submitted {job['job_id']} for tenant {job['tenant']}: {job['state']}{again}")
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    def work(client: Client) -> int:
        jobs = client.jobs(state=args.state, tenant=args.tenant, name=args.name, since=args.since, until=args.until,
                           array=args.array, limit=args.limit)["jobs"]
        if args.array:  # in index order
            jobs.sort(key=lambda j: int(j["job_id"].rpartition(".")[2]) if j["job_id"].rpartition(".")[2].isdigit()
                      else -1)
        rows = [(j["job_id"], j["name"], j["tenant"], j["state"], j["gpus"], j["gpu_model"], j["node_id"],
                 j["exit_code"], "; ".join(j["reasons"] or [])[:60]) for j in jobs]
        output(jobs, args.json, render(["JOB", "NAME", "TENANT", "STATE", "GPUS", "MODEL", "NODE", "EXIT", "REASON"],
                                       rows))
        return 0

    return through_gateway("jobs", work)


def cmd_queue(args: argparse.Namespace) -> int:
    def work(client: Client) -> int:
        jobs = client.queue(args.tenant)["jobs"]
        starts = estimates.estimates_by_job(client, args.tenant) if args.start else {}
        jobs = [{**j, "estimate": starts.get(j["job_id"])} for j in jobs] if args.start else jobs
        rows = [(j["queue"], j["position"] or "-", j["job_id"], j.get("tenant", "-"), j.get("priority", "-"),
                 j.get("gpus", "-"), j.get("gpu_model"),
                 *([estimates.relative(j["estimate"])] if args.start else []),
                 (f"behind {j['ahead_higher_priority']} of higher priority; " if j.get("ahead_higher_priority") else "")
                 + j.get("reason", "")) for j in jobs]
        output(jobs, args.json, render(["QUEUE", "#", "JOB", "TENANT", "PRIO", "GPUS", "MODEL",
                                        *(["EST. START"] if args.start else []), "WHY"], rows))
        return 0

    return through_gateway("queue", work)


def cmd_job(args: argparse.Namespace) -> int:
    def work(client: Client) -> int:
        if args.follow:
            for event in client.events(args.job_id, follow=True):
                if args.json:
                    print(json.dumps(event, default=str), flush=True)
                else:
                    print(f"{event['version']:>3}  {event['occurred_at']}  {event['type']:<20} {_detail(event)}",
                          flush=True)
            return 0
        job = client.job(args.job_id)
        waiting = job.get("waiting")
        fields = [(k, job[k]) for k in job if k not in ("events", "waiting")]
        if waiting:
            fields.append(("waiting", f"#{waiting['position'] or '-'} in {waiting['queue']}: {waiting['reason']}"))
            if (estimate := estimates.job_estimate(client, job)) is not None:
                job["estimate"] = estimate
                fields.append(("est. start", estimates.describe(estimate)))
        history = render(["#", "EVENT", "BY", "AT", "DETAIL"], [(e["version"], e["type"], e["producer"],
                                                                 e["occurred_at"], _detail(e)) for e in job["events"]])
        output(job, args.json, f"{render(['FIELD', 'VALUE'], fields)}\n\n{history}")
        return 0

    return through_gateway("job", work)


def exit_status(last: dict[str, Any]) -> int:
    """The exit code a script sees for a job's last event: the command's own when it ran and ended, 1 when
    it failed without one, 125 when rejected, 130 when cancelled (as a shell reports SIGINT)."""
    payload = last.get("payload") or {}
    if last["type"] == "JobSucceeded":
        return 0
    if last["type"] == "JobFailed":
        code = payload.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return {"JobRejected": 125, "JobCancelled": 130}.get(last["type"], 1)


def _follow(client: Client, job_id: str, as_json: bool) -> int:
    last: dict[str, Any] | None = None
    for event in client.events(job_id, follow=True):
        last = event
        if as_json:
            print(json.dumps(event, default=str), flush=True)
        else:
            print(f"{event['version']:>3}  {event['occurred_at']}  {event['type']:<20} {_detail(event)}", flush=True)
    if last is None or last["type"] not in ("JobSucceeded", "JobFailed", "JobRejected", "JobCancelled"):
        print(f"gpusched: stopped following {job_id} before it ended", file=sys.stderr)
        return 1
    return exit_status(last)


def cmd_watch(args: argparse.Namespace) -> int:
    return through_gateway("watch", lambda client: _follow(client, args.job_id, args.json))


def for_each(command: str, args: argparse.Namespace, act: Callable[[Client, str], dict[str, Any]], key: str,
          ids: list[str] | None = None, id_field: str = "job_id") -> int:
    """``act`` on each job (or node) named, a table of what each answered; exit 1 when one was refused."""
    def work(client: Client) -> int:
        outcomes = []
        for one in ids if ids is not None else args.job_ids:
            try:
                outcomes.append(act(client, one))
            except ApiError as exc:
                outcomes.append({id_field: one, "state": None, key: f"refused: {exc.detail}"})
        columns = [id_field.split("_")[0].upper(), *(["STATE"] if id_field == "job_id" else []), key.upper()]
        rows = [(o[id_field], *([o.get("state") or "-"] if id_field == "job_id" else []), o[key]) for o in outcomes]
        output(outcomes, args.json, render(columns, rows))
        return 1 if any(str(o[key]).startswith("refused") for o in outcomes) else 0

    return through_gateway(command, work)


def cmd_hold(args: argparse.Namespace) -> int:
    return for_each("hold", args, lambda client, job_id: client.hold(job_id, args.reason), "hold")


def cmd_release(args: argparse.Namespace) -> int:
    return for_each("release", args, lambda client, job_id: client.release(job_id), "release")


def _every_job(client: Client, tenant: str | None, state: str | None) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = client.jobs(tenant=tenant, state=state, limit=500, cursor=cursor)
        ids.extend(j["job_id"] for j in page["jobs"] if j["state"] not in FINISHED)
        cursor = page["next"]
        if cursor is None:
            return ids


def cmd_cancel(args: argparse.Namespace) -> int:
    if not args.job_ids and not (args.tenant or args.state):
        print("gpusched cancel: name the jobs, or select them with --tenant and/or --state", file=sys.stderr)
        return 2

    def work(client: Client) -> int:
        ids = args.job_ids or _every_job(client, args.tenant, args.state)
        outcomes = []
        for job_id in ids:
            try:
                outcomes.append(client.cancel(job_id, args.reason))
            except ApiError as exc:  # one job refused (not found, not yours): say so and go on with the rest
                outcomes.append({"job_id": job_id, "state": None, "cancel": f"refused: {exc.detail}"})
        rows = [(o["job_id"], o.get("state") or ("array" if "array_id" in o else "-"),
                 o["cancel"] + (f" ({o['requested']} of {o['tasks']} tasks)" if "array_id" in o else ""))
                for o in outcomes]
        output(outcomes, args.json, render(["JOB", "STATE", "CANCEL"], rows) if rows else "no job to cancel")
        return 1 if any(o["cancel"].startswith("refused") for o in outcomes) else 0

    return through_gateway("cancel", work)


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
