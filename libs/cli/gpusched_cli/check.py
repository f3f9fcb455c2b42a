"""`gpusched submit --check`: each job of the flags or of ``-f FILE`` judged against the live cluster by the
gateway (``POST /v1/jobs:check``) without submitting it: the summary, then a table of each stage and its
reasons (or the answers as JSON). Exit 0 when every job would start (now or after preempting), 3 when one
would wait, 2 when one could never run here (or a request is invalid)."""

from __future__ import annotations

import json
from typing import Any

from gpusched import Client
from gpusched_common.table import render

from gpusched_cli.estimates import relative

EXIT = {"start": 0, "preempt": 0, "wait": 3, "never": 2}
STAGES = ("admission", "quota", "placement", "preemption")
HELP = ("judge the job(s) against the live cluster without submitting: would it start now, after preempting "
        "lower-priority jobs, wait (and why), or never run here; exit 0 start/preempt, 3 wait, 2 never")


def exit_code(verdicts: list[str]) -> int:
    """Never beats wait beats start: the worst of the jobs checked."""
    codes = [EXIT.get(v, 1) for v in verdicts]
    return 2 if 2 in codes else 3 if 3 in codes else max(codes, default=0)


def readable(answer: dict[str, Any]) -> str:
    """The summary, then one row per reason of each stage (a stage not reached says so)."""
    rows: list[tuple[str, str, str]] = []
    for name in STAGES:
        stage = answer["stages"].get(name)
        if stage is None:
            continue
        state = {True: "ok", False: "no", None: "-"}[stage["ok"]]
        for i, reason in enumerate(stage["reasons"] or [""]):
            rows.append((name if i == 0 else "", state if i == 0 else "", reason))
    lines = [answer["summary"], "", render(("stage", "ok", "reason"), rows)]
    if answer.get("victims"):
        lines += ["", render(("victim", "tenant", "priority"),
                             [(v["job_id"], v["tenant"], v["priority"]) for v in answer["victims"]])]
    if answer["verdict"] == "wait" and answer.get("estimated_start"):
        estimate = answer.get("estimate") or {}
        source = f"; run-time from {estimate['runtime_source']}" if estimate.get("runtime_source") else ""
        lines += ["", f"estimated start: {relative(answer)} ({answer['estimated_start']}{source})"]
    elif answer["verdict"] == "wait" and answer.get("estimate"):
        lines += ["", f"estimated start: unknown ({answer['estimate']['reason']})"]
    return "\n".join(lines)


def check_jobs(client: Client, bodies: list[dict[str, Any]], as_json: bool) -> int:
    """Check each JobSpec in order; print each answer; the exit code of the worst."""
    answers = [client.check(body) for body in bodies]
    if as_json:
        print(json.dumps(answers[0] if len(answers) == 1 else answers, indent=2, default=str))
    else:
        print("\n\n".join(readable(a) for a in answers))
    return exit_code([a["verdict"] for a in answers])

