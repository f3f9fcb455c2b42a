"""Reclaim end to end on the local stack (issue 5): a team under its nominal quota gets back the capacity
that another team borrowed.

Cohort `lab` (tests/e2e/reclaim_tenants.yaml) on 2 nodes x 4 H100-80GB: team-a and team-b are each owed 4
GPUs and may borrow the other 4. Team-b fills the cluster with checkpointing jobs (one 4-GPU job on one
node, two 2-GPU jobs on the other), borrowing team-a's idle half; then team-a asks for its 4 GPUs at the
same priority (so no priority preemption can be what frees them). Quota publishes a ``ReclaimRequested``;
the preemption service stops the fewest team-b jobs that free a node and give back 4 GPUs of quota (the
4-GPU job, not the pair), telling it why; quota asks again while the victim checkpoints, which adds no
victim; team-a's job runs on the freed GPUs and succeeds; the victim requeues and resumes from the
checkpoint it wrote. No GPU is ever held by two jobs, in the event store or on the node (each job takes a
lock per GPU it was given), and every step is in the jobs' histories with its reason.

The partial release: team-b fills the cluster with 2-GPU jobs only, so the fewest victims that free a
node for team-a's 4-GPU job are the two on one node, and they stop at different times (1 s and 5 s to
checkpoint). The capacity the first one frees must wait for team-a (the requeued victim may not borrow it
back) and quota's repeated requests meanwhile add no third victim; team-a's job runs on the pair's GPUs,
the pair resume from their checkpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from gpusched_common.db import connect
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_pipeline import job_view

TENANTS_FILE = Path(__file__).with_name("reclaim_tenants.yaml")
MODEL = "H100-80GB"
STACK_NODES = 2
STACK_GPU_MODELS = [MODEL]
STACK_GPUS_PER_NODE = 4
STACK_ENV = {"GPUSCHED_TENANTS_FILE": str(TENANTS_FILE),
             "GPUSCHED_QUOTA_RECLAIM_COOLDOWN_S": "2",  # repeats while the victims stop must not add victims
             "GPUSCHED_PREEMPTION_GRACE_S": "10", "GPUSCHED_PREEMPTION_MIN_RUNTIME_S": "0",
             "GPUSCHED_RECONCILE_INTERVAL_S": "1"}

# Every job takes a lock directory per GPU it was given (CUDA_VISIBLE_DEVICES) in its node's job dir and
# notes it in `double-booked` if another job holds one; it gives them back when it ends, however it ends.
HOLD_GPUS = (
    'cd "$GPUSCHED_JOB_DIR"; gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr , " "); '
    'for g in $gpus; do mkdir "gpu-$g.held" 2>/dev/null '
    '|| echo "$GPUSCHED_JOB_ID got GPU $g held by another job" >> double-booked; done; '
    'free_gpus() { for g in $gpus; do rmdir "gpu-$g.held" 2>/dev/null; done; }; '
)


def borrower_job(stop_s: str) -> str:
    """Team-b's work: checkpoints every 0.2 s for up to 15 s; on SIGTERM takes ``stop_s`` (shell: a number
    or an expansion) to write a final checkpoint and exits; resumed, it notes where from and finishes."""
    return HOLD_GPUS + (
        'if [ -n "$GPUSCHED_RESUME_FROM" ]; then echo "$GPUSCHED_RESUME_FROM" > "resumed-$GPUSCHED_JOB_ID"; '
        'sleep 0.5; free_gpus; exit 0; fi; '
        f'trap \'sleep {stop_s}; echo "final-$GPUSCHED_JOB_ID" > "$GPUSCHED_CHECKPOINT_FILE"; free_gpus; exit 143\' '
        'TERM; '
        'i=0; while [ $i -lt 75 ]; do i=$((i+1)); echo "step-$i" > "$GPUSCHED_CHECKPOINT_FILE"; sleep 0.2; done; '
        'free_gpus'
    )


# 4 s to stop: longer than quota's reclaim cooldown, so quota asks again while the victim stops.
BORROWER_JOB = borrower_job("4")
# Of two 2-GPU jobs on a node exactly one holds GPU 0: it stops in 1 s, the other in 5 s (quota asks again
# in between, when the first has given its GPUs and quota back and the second still holds its own).
STAGGERED_BORROWER_JOB = ('case ",$CUDA_VISIBLE_DEVICES," in *,0,*) stop_s=1;; *) stop_s=5;; esac; '
                          + borrower_job("$stop_s"))
OWNER_JOB = HOLD_GPUS + 'sleep 2; free_gpus'
RECLAIM_REASON = (f"preempted to return borrowed {MODEL} capacity to tenant team-a (under its nominal quota) "
                  "for its job {job}: tenant team-b borrowed it")


async def borrowers_running(db: str, borrowed: list[str]) -> dict[str, dict]:
    """Wait until team-b's jobs all run with a checkpoint; their JobPlaced payloads by job id."""
    await wait_for(db, "team-b's jobs running, each with a checkpoint",
                   "SELECT count(*) = cardinality($1::text[]) FROM jobs j WHERE job_id = ANY($1::text[])"
                   " AND status = 'Running' AND EXISTS (SELECT 1 FROM events e"
                   "  WHERE e.stream_id = 'job-' || j.job_id AND e.type = 'JobCheckpointed')", borrowed)
    return {j: event(await job_view(db, j), "JobPlaced") for j in borrowed}


async def submit_owner_and_await_reclaim(client: Client, db: str, borrowed: list[str]) -> tuple[str, datetime, dict]:
    """team-b borrows all of team-a's idle half; team-a submits a 4-GPU job at the same priority (so only the
    reclaim path can free room): the job, when it was submitted, and quota's first reclaim for it."""
    reservations = [event(await job_view(db, j), "QuotaReserved") for j in borrowed]
    assert {(r["tenant"], r["gpu_model"]) for r in reservations} == {("team-b", MODEL)}
    assert sum(r["borrowed_gpus"] for r in reservations) == 4  # all of team-a's idle half
    submitted = datetime.now(timezone.utc)
    owner = await client.submit(a_job("x").tenant("team-a").gpus(4).model(MODEL)
                                .command("sh", "-c", OWNER_JOB).spec())
    reclaim = await wait_for_row(db, "a reclaim for team-a",
                                 "SELECT * FROM quota_reclaims WHERE tenant = 'team-a' AND $1 = ANY(for_jobs)"
                                 " ORDER BY requested_at LIMIT 1", owner)
    assert (reclaim["flavor"], reclaim["cohort"], reclaim["units"]) == (MODEL, "lab", 4 * 7000)
    assert reclaim["borrowers"] == [{"tenant": "team-b", "borrowed_gpus": 4.0}]
    return owner, submitted, reclaim


async def test_a_team_under_its_nominal_quota_reclaims_what_another_team_borrowed(local_stack, stack_settings):
    db = local_stack.database_url
    borrower = a_job("x").tenant("team-b").model(MODEL).command("sh", "-c", BORROWER_JOB)
    async with Client(stack_settings) as client:
        # team-b fills both nodes: a 4-GPU job on one, two 2-GPU jobs on the other
        large = await client.submit(borrower.gpus(4).spec())
        small = [await client.submit(borrower.gpus(2).spec()) for _ in range(2)]
        borrowed = [large, *small]
        placements = await borrowers_running(db, borrowed)
        assert placements[small[0]]["node_id"] == placements[small[1]]["node_id"] != placements[large]["node_id"]
        owner, submitted, reclaim = await submit_owner_and_await_reclaim(client, db, borrowed)
    reclaimed_after = (reclaim["requested_at"] - submitted).total_seconds()
    assert reclaim["reason"] == (f"tenant team-a holds 0 of its nominal 4 {MODEL} while team-b borrows 4: "
                                 f"reclaim 4 for 1 waiting job")

    await wait_until_finished(db, [owner], timeout_s=60, interval_s=0.2)
    owner_done_after = (datetime.now(timezone.utc) - submitted).total_seconds()
    await wait_until_finished(db, borrowed, timeout_s=60, interval_s=0.3)
    all_done_after = (datetime.now(timezone.utc) - submitted).total_seconds()

    # team-a's job: waited for quota saying why, then got its own quota (nothing borrowed) and ran
    view = await wait_for_history(db, owner, "QuotaReleased")
    assert view["status"] == "Succeeded", view
    types = [e["type"] for e in view["events"]]
    assert types[:3] == ["JobSubmitted", "JobAdmitted", "QuotaDeferred"], types
    assert types[-5:] == ["QuotaReserved", "JobPlaced", "JobStarted", "JobSucceeded", "QuotaReleased"], types
    assert set(types[2:-5]) == {"QuotaDeferred"}, types  # it waited for quota only, then ran once
    waited = event(view, "QuotaDeferred")
    assert waited["tenant"] == "team-a" and waited["reason"] == (
        f"tenant team-a under quota (0/4 {MODEL}) while others borrow its share; reclaim requested"), waited
    reserved = event(view, "QuotaReserved")
    assert (reserved["tenant"], reserved["borrowed_gpus"]) == ("team-a", 0)
    placed = event(view, "JobPlaced")
    assert placed["node_id"] == placements[large]["node_id"]
    assert sorted(placed["gpu_indices"]) == sorted(placements[large]["gpu_indices"])

    # the fewest victims: the one 4-GPU job (two 2-GPU jobs would free as much), told why
    preempted_jobs = [j for j in borrowed
                      if "PreemptionRequested" in [e["type"] for e in (await job_view(db, j))["events"]]]
    assert preempted_jobs == [large], preempted_jobs
    history = await wait_for_history(db, large, "QuotaReleased")
    assert history["status"] == "Succeeded", history
    types = [e["type"] for e in history["events"] if e["type"] != "JobCheckpointed"]
    assert types == ["JobSubmitted", "JobAdmitted", "QuotaReserved", "JobPlaced", "JobStarted",
                     "PreemptionRequested", "JobPreempted",  # stopped for team-a, with a final checkpoint
                     "QuotaReleased", "QuotaDeferred",  # gave back its quota, waited while team-a's job ran
                     "QuotaReserved", "JobPlaced", "JobStarted", "JobSucceeded", "QuotaReleased"], types
    requested = event(history, "PreemptionRequested")
    assert (requested["preemptor_job_id"], requested["preemptor_tenant"]) == (owner, "team-a")
    assert requested["reason"].startswith(RECLAIM_REASON.format(job=owner)), requested
    assert "since last checkpoint" in requested["reason"], requested
    preempted = event(history, "JobPreempted")
    assert preempted["checkpoint_ref"] == f"final-{large}"
    requeued = last(history, "QuotaDeferred")
    assert requeued["reason"].startswith("tenant team-b at quota (4/4"), requeued
    resumed_on = last(history, "JobPlaced")["node_id"]
    resumed = Path(local_stack.home) / "agents" / resumed_on / "jobs" / large / f"resumed-{large}"  # its own dir
    assert resumed.read_text().strip() == f"final-{large}"  # GPUSCHED_RESUME_FROM: its last checkpoint
    for survivor in small:
        types = [e["type"] for e in (await job_view(db, survivor))["events"]]
        assert types.count("JobPlaced") == 1 and "PreemptionRequested" not in types, types

    # quota asked again while the victim checkpointed (cooldown 2 s < 4 s): the repeats added no victim
    requests = await fetch_rows(db, "SELECT requested_at FROM quota_reclaims WHERE tenant = 'team-a'"
                                    " AND $1 = ANY(for_jobs)", owner)
    assert len(requests) >= 2, requests
    evaluation = (await fetch_rows(db, "SELECT outcome, reasons FROM preemption_evaluations WHERE job_id = $1",
                                   owner))[0]
    assert evaluation["reasons"][0].startswith("reclaim of "), evaluation
    assert f"GPU(s) for tenant team-a (under its nominal quota), for its job {owner}" in evaluation["reasons"][0]
    # the last answer: the victim still stopping ("await") or, once it stopped, room for the job ("fits")
    assert evaluation["outcome"] in ("preempt", "await", "fits"), evaluation

    # no GPU held by two jobs at once: in the event store (in global order) and on the nodes themselves
    await assert_no_gpu_held_twice(db, [owner, *borrowed], runs=len(borrowed) + 2)
    await assert_cluster_left_empty(local_stack)
    timeline = await fetch_rows(
        db, "SELECT type, min(occurred_at) AS at FROM events WHERE stream_id = ANY($1::text[])"
            " AND type IN ('PreemptionRequested', 'JobPreempted') GROUP BY type", [f"job-{large}"])
    at = {r["type"]: r["at"] for r in timeline}
    print(f"\nreclaim requested {reclaimed_after:.1f} s after team-a's submission ({len(requests)} request(s));"
          f" victim asked to stop {(at['PreemptionRequested'] - reclaim['requested_at']).total_seconds():.2f} s"
          f" after the request, stopped {(at['JobPreempted'] - at['PreemptionRequested']).total_seconds():.1f} s"
          f" later; team-a's job done after {owner_done_after:.1f} s; all jobs after {all_done_after:.1f} s")


async def test_two_victims_on_one_node_stop_at_different_times_and_what_the_first_frees_waits_for_the_owner(
        local_stack, stack_settings):
    db = local_stack.database_url
    await assert_cluster_left_empty(local_stack)  # what ran before in this module is done
    borrower = a_job("x").tenant("team-b").model(MODEL).gpus(2).command("sh", "-c", STAGGERED_BORROWER_JOB)
    async with Client(stack_settings) as client:
        # team-b fills both nodes with 2-GPU jobs: two per node
        borrowed = [await client.submit(borrower.spec()) for _ in range(4)]
        placements = await borrowers_running(db, borrowed)
        assert sorted(Counter(p["node_id"] for p in placements.values()).values()) == [2, 2], placements
        owner, submitted, reclaim = await submit_owner_and_await_reclaim(client, db, borrowed)
    reclaimed_after = (reclaim["requested_at"] - submitted).total_seconds()

    await wait_until_finished(db, [owner], timeout_s=60, interval_s=0.2)
    owner_done_after = (datetime.now(timezone.utc) - submitted).total_seconds()
    await wait_until_finished(db, borrowed, timeout_s=60, interval_s=0.3)
    all_done_after = (datetime.now(timezone.utc) - submitted).total_seconds()

    # the fewest victims that free a node: the two 2-GPU jobs on one node, and no third one
    views = {j: await job_view(db, j) for j in borrowed}
    victims = [j for j in borrowed if "PreemptionRequested" in [e["type"] for e in views[j]["events"]]]
    assert len(victims) == 2, "\n".join(
        f"{j}: {[e['type'] for e in v['events'] if e['type'] != 'JobCheckpointed']}" for j, v in views.items())
    node = placements[victims[0]]["node_id"]
    assert placements[victims[1]]["node_id"] == node, placements
    # the one on GPU 0 stops in 1 s, the other in 5 s
    early, late = sorted(victims, key=lambda j: 0 not in placements[j]["gpu_indices"])
    for survivor in set(borrowed) - set(victims):
        types = [e["type"] for e in views[survivor]["events"]]
        assert types.count("JobPlaced") == 1 and "PreemptionRequested" not in types, types
        assert placements[survivor]["node_id"] != node

    # team-a's job: waited for quota, then got its own quota and ran once, on the pair's GPUs
    view = await wait_for_history(db, owner, "QuotaReleased")
    assert view["status"] == "Succeeded", view
    types = [e["type"] for e in view["events"]]
    assert types[:3] == ["JobSubmitted", "JobAdmitted", "QuotaDeferred"], types
    assert types[-5:] == ["QuotaReserved", "JobPlaced", "JobStarted", "JobSucceeded", "QuotaReleased"], types
    assert set(types[2:-5]) == {"QuotaDeferred"}, types
    assert event(view, "QuotaDeferred")["reason"] == (
        f"tenant team-a under quota (0/4 {MODEL}) while others borrow its share; reclaim requested")
    reserved = event(view, "QuotaReserved")
    assert (reserved["tenant"], reserved["borrowed_gpus"]) == ("team-a", 0)
    placed = event(view, "JobPlaced")
    assert placed["node_id"] == node
    assert sorted(placed["gpu_indices"]) == sorted(g for v in victims for g in placements[v]["gpu_indices"])
    owner_placed, owner_succeeded = at(view, "JobPlaced"), at(view, "JobSucceeded")

    # each victim: stopped once for team-a with a final checkpoint, gave back its quota, waited while
    # team-a's job ran, resumed from its checkpoint and finished
    histories = {v: await wait_for_history(db, v, "QuotaReleased") for v in victims}
    for victim, history in histories.items():
        assert history["status"] == "Succeeded", history
        types = [e["type"] for e in history["events"] if e["type"] != "JobCheckpointed"]
        assert types[:8] == ["JobSubmitted", "JobAdmitted", "QuotaReserved", "JobPlaced", "JobStarted",
                             "PreemptionRequested", "JobPreempted", "QuotaReleased"], types
        assert types[-5:] == ["QuotaReserved", "JobPlaced", "JobStarted", "JobSucceeded", "QuotaReleased"], types
        assert len(types) > 13 and set(types[8:-5]) == {"QuotaDeferred"}, types  # it waited for quota only
        requested = event(history, "PreemptionRequested")
        assert (requested["preemptor_job_id"], requested["preemptor_tenant"]) == (owner, "team-a")
        assert requested["reason"].startswith(RECLAIM_REASON.format(job=owner)), requested
        assert event(history, "JobPreempted")["checkpoint_ref"] == f"final-{victim}"
        assert at(history, "JobPlaced", last_one=True) >= owner_succeeded  # not back before team-a was done
        resumed_on = last(history, "JobPlaced")["node_id"]
        resumed = Path(local_stack.home) / "agents" / resumed_on / "jobs" / victim / f"resumed-{victim}"
        assert resumed.read_text().strip() == f"final-{victim}"  # GPUSCHED_RESUME_FROM: its last checkpoint

    # the pair gave their GPUs back seconds apart; team-a's job was placed only once both had
    stopped = {v: at(histories[v], "JobPreempted") for v in victims}
    gap = (stopped[late] - stopped[early]).total_seconds()
    assert gap >= 3, stopped
    assert owner_placed >= stopped[late], (owner_placed, stopped)
    # meanwhile the quota the first one gave back stayed owed to team-a: it did not borrow it back
    early_waits = [e["payload"]["reason"] for e in histories[early]["events"] if e["type"] == "QuotaDeferred"]
    assert any(r.startswith(f"cohort capacity of {MODEL} is owed to tenants under their nominal quota: team-a")
               for r in early_waits), early_waits

    # quota asked again while the pair stopped (cooldown 2 s < 5 s): the repeats added no victim
    requests = await fetch_rows(db, "SELECT requested_at, reason FROM quota_reclaims WHERE tenant = 'team-a'"
                                    " AND $1 = ANY(for_jobs) ORDER BY requested_at", owner)
    assert len(requests) >= 2, requests
    evaluation = (await fetch_rows(db, "SELECT outcome, reasons FROM preemption_evaluations WHERE job_id = $1",
                                   owner))[0]
    assert evaluation["reasons"][0].startswith("reclaim of "), evaluation
    assert evaluation["outcome"] in ("preempt", "await", "fits"), evaluation

    # no GPU held by two jobs at once: in the event store and on the nodes; the cluster is left empty
    await assert_no_gpu_held_twice(db, [owner, *borrowed], runs=len(borrowed) + len(victims) + 1)
    await assert_cluster_left_empty(local_stack)
    asked = at(histories[early], "PreemptionRequested")
    print(f"\nreclaim requested {reclaimed_after:.1f} s after team-a's submission ({len(requests)} request(s));"
          f" victims stopped {(stopped[early] - asked).total_seconds():.1f} s and"
          f" {(stopped[late] - asked).total_seconds():.1f} s after being asked; team-a's job placed"
          f" {(owner_placed - stopped[late]).total_seconds():.2f} s after the second, done after"
          f" {owner_done_after:.1f} s; all jobs after {all_done_after:.1f} s; the first victim waited:"
          f" {sorted(set(early_waits))}")


def at(view: dict, event_type: str, *, last_one: bool = False) -> datetime:
    """When the first (or last) event of ``event_type`` in a job's history occurred."""
    times = [e["occurred_at"] for e in view["events"] if e["type"] == event_type]
    return datetime.fromisoformat(times[-1] if last_one else times[0])


def event(view: dict, event_type: str) -> dict:
    """The payload of the first event of ``event_type`` in a job's history."""
    return next(e["payload"] for e in view["events"] if e["type"] == event_type)


def last(view: dict, event_type: str) -> dict:
    return [e["payload"] for e in view["events"] if e["type"] == event_type][-1]


async def wait_for(database_url: str, what: str, query: str, *args, timeout_s: float = 60) -> None:
    """Poll until ``query`` returns true."""
    conn = await connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while not await conn.fetchval(query, *args):
            assert time.monotonic() < deadline, f"not in {timeout_s} s: {what}"
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def wait_for_row(database_url: str, what: str, query: str, *args, timeout_s: float = 60) -> dict:
    conn = await connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while (row := await conn.fetchrow(query, *args)) is None:
            assert time.monotonic() < deadline, f"not in {timeout_s} s: {what}"
            await asyncio.sleep(0.1)
        return dict(row)
    finally:
        await conn.close()


async def fetch_rows(database_url: str, query: str, *args) -> list[dict]:
    conn = await connect(database_url)
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


async def wait_for_history(database_url: str, job_id: str, last_type: str, timeout_s: float = 20) -> dict:
    """The job's view once its history ends with ``last_type`` (quota's release follows the terminal event)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = await job_view(database_url, job_id)
        if view["events"][-1]["type"] == last_type:
            return view
        assert time.monotonic() < deadline, [e["type"] for e in view["events"]]
        await asyncio.sleep(0.1)


async def assert_cluster_left_empty(local_stack) -> None:
    """No job noted a GPU held by another on any node, every job gave its GPUs back, and nothing is
    allocated, held for a job or reserved in quota (so the next test of the module starts from empty)."""
    for node in local_stack.node_ids:
        node_dir = Path(local_stack.home) / "agents" / node
        assert not (node_dir / "double-booked").exists(), (node_dir / "double-booked").read_text()
        assert not list(node_dir.glob("gpu-*.held"))  # every job gave its GPUs back
    conn = await connect(local_stack.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
        assert await conn.fetchval("SELECT count(*) FROM gpu_nominations") == 0
        # quota releases a job's reservation when it reads the job's end, after placement recorded it
        deadline = asyncio.get_running_loop().time() + 30
        while (held := await conn.fetch("SELECT job_id FROM quota_policy_reservations")):
            assert asyncio.get_running_loop().time() < deadline, f"reservations never released: {held}"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def assert_no_gpu_held_twice(database_url: str, job_ids: list[str], runs: int) -> None:
    """Replay the jobs' events in global order: a placement takes GPUs, the end of that run (preempted,
    finished, requeued) gives them back; no GPU may be taken while another run holds it."""
    ends = {"JobPreempted", "JobSucceeded", "JobFailed", "JobCancelled", "JobRequeued"}
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT stream_id, type, payload FROM events WHERE stream_id = ANY($1::text[])"
                                " AND type = ANY($2::text[]) ORDER BY global_position",
                                [f"job-{j}" for j in job_ids], ["JobPlaced", *ends])
    finally:
        await conn.close()
    held: dict[tuple[str, int], str] = {}
    placed = 0
    for row in rows:
        payload, job = row["payload"], row["stream_id"]
        if row["type"] == "JobPlaced":
            placed += 1
            for gpu in payload["gpu_indices"]:
                key = (payload["node_id"], gpu)
                assert key not in held, f"{job} placed on {key} while {held[key]} holds it"
                held[key] = job
        else:
            for key in [k for k, holder in held.items() if holder == job]:
                del held[key]
    assert placed == runs and not held
