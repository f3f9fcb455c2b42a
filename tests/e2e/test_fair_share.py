"""Fair-share preemption and fair backfill end to end on the local stack (issue 19): a team that borrows far
past its fair share gives way to a team that waits for room within its own.

Cohort `lab` (tests/e2e/fair_share_tenants.yaml) on 2 nodes x 4 H100-80GB: team-b runs a 3-GPU job on each
node (6 GPUs: it borrows 4 of idle team-c's), leaving one GPU free on each. Team-a asks for three 2-GPU jobs:
the first to reach quota fits it (2 of the cohort's 8 are free) but no node (1 free on each), and no priority preemption
can help (one priority). Team-a, entitled to 4 of the 8 with that demand, would be at 0.5 of its fair share
once the job runs; team-b is at 1.5, past 1.5 x 0.5: the preemption service stops one of team-b's runs
(older than the quantum, here 2 s), telling it why, and holds its GPUs for team-a's job; while that job
waits, quota gives team-b's requeued run no quota back (fair backfill). Team-a's job runs on the freed GPUs,
the victim resumes from its checkpoint, every job succeeds, and no GPU is ever held by two jobs.
"""

from __future__ import annotations

from pathlib import Path

from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_reclaim import (
    OWNER_JOB,
    assert_cluster_left_empty,
    assert_no_gpu_held_twice,
    borrower_job,
    borrowers_running,
    event,
    job_view,
    wait_for,
    wait_for_history,
)

TENANTS_FILE = Path(__file__).with_name("fair_share_tenants.yaml")
MODEL = "H100-80GB"
STACK_NODES = 2
STACK_GPU_MODELS = [MODEL]
STACK_GPUS_PER_NODE = 4
STACK_ENV = {"GPUSCHED_TENANTS_FILE": str(TENANTS_FILE), "GPUSCHED_FAIR_SHARE_QUANTUM_S": "2",
             "GPUSCHED_PREEMPTION_GRACE_S": "10", "GPUSCHED_PREEMPTION_MIN_RUNTIME_S": "0",
             "GPUSCHED_RECONCILE_INTERVAL_S": "1"}


async def test_a_team_far_over_its_fair_share_gives_way_to_one_waiting_for_room_within_its_own(
        local_stack, stack_settings):
    db = local_stack.database_url
    borrower = a_job("x").tenant("team-b").model(MODEL).gpus(3).command("sh", "-c", borrower_job("1"))
    owner = a_job("x").tenant("team-a").model(MODEL).gpus(2).command("sh", "-c", OWNER_JOB)
    async with Client(stack_settings) as client:
        borrowed = [await client.submit(borrower.spec()) for _ in range(2)]
        placements = await borrowers_running(db, borrowed)
        assert placements[borrowed[0]]["node_id"] != placements[borrowed[1]]["node_id"], placements
        await wait_for(db, "team-b's runs older than the quantum",
                       "SELECT bool_and(started_at < now() - interval '2.5 seconds') FROM jobs"
                       " WHERE job_id = ANY($1::text[])", borrowed)
        owners = [await client.submit(owner.spec()) for _ in range(3)]
    await wait_until_finished(db, owners + borrowed, timeout_s=90, interval_s=0.3)

    # one of team-b's runs was preempted for one of team-a's jobs (the first whose placement was deferred:
    # submitted a few ms apart, they reach placement on different partitions, in no promised order), by fair
    # share, and told why
    views = {j: await wait_for_history(db, j, "QuotaReleased") for j in [*owners, *borrowed]}
    assert all(v["status"] == "Succeeded" for v in views.values()), {j: v["status"] for j, v in views.items()}
    victims = [j for j in borrowed if "PreemptionRequested" in [e["type"] for e in views[j]["events"]]]
    assert len(victims) == 1, {j: [e["type"] for e in v["events"]] for j, v in views.items()}
    [victim] = victims
    requested = event(views[victim], "PreemptionRequested")
    first = requested["preemptor_job_id"]
    assert first in owners and requested["preemptor_tenant"] == "team-a", (requested, owners)
    assert requested["reason"].startswith(f"preempted for job {first} of priority 0 in tenant team-a, because "
                                          "tenant team-b is above its fair share"), requested
    selected = event(views[first], "VictimsSelected")
    assert selected["victims"] == [victim] and selected["reason"].startswith("fair-share preemption: "), selected
    placed = event(views[first], "JobPlaced")
    assert placed["node_id"] == placements[victim]["node_id"], (placed, placements)

    # the victim: gave back its quota, waited (held back by fair backfill while team-a's job waited for room,
    # among other reasons), resumed from its last checkpoint and finished
    waits = [e["payload"]["reason"] for e in views[victim]["events"] if e["type"] == "QuotaDeferred"]
    assert waits, [e["type"] for e in views[victim]["events"]]
    resumed_on = [e["payload"] for e in views[victim]["events"] if e["type"] == "JobPlaced"][-1]["node_id"]
    resumed = Path(local_stack.home) / "agents" / resumed_on / "jobs" / victim / f"resumed-{victim}"
    assert resumed.read_text().strip() == f"final-{victim}"

    await assert_no_gpu_held_twice(db, [*owners, *borrowed], runs=len(owners) + len(borrowed) + 1)
    await assert_cluster_left_empty(local_stack)
    print(f"\nthe victim waited for quota with: {sorted(set(waits))}")
