"""A reader's view of the quota queue: the cycle's own fair-share order, positions and reasons."""

from __future__ import annotations

from gpusched_cli.queries import describe_wait
from gpusched_common.stores.jobs import higher_ahead
from gpusched_core.quota import UNITS_PER_GPU, UsageHistory, load_tenancy
from gpusched_core.quota.positions import NEXT_CYCLE, QuotaQueueEntry, rank_cohort
from gpusched_core.quota.jobs import QueuedJob

TENANCY = load_tenancy("""
version: 1
flavors: [A100-80GB]
priority_classes: {high: 50, batch: 10}
default_priority_class: batch
fair_share: {half_life_s: 3600}
guest_tenant: team-b
tenants:
  - name: acme
    children:
      - name: team-a
        quota: {A100-80GB: {nominal: 2}}
      - name: team-b
        quota: {A100-80GB: {nominal: 4}}
""")
NOW = 10_000.0
FULL = {"team-a": {"A100-80GB": 2 * UNITS_PER_GPU}, "team-b": {"A100-80GB": 4 * UNITS_PER_GPU}}
# team-a ran far more than its share lately, team-b nothing: team-b's jobs rank first within a class
HISTORY = {"team-a": UsageHistory(NOW, {"A100-80GB": 5e7}), "team-b": UsageHistory(NOW, {})}


def job(job_id: str, tenant: str, at: float, priority: int = 0, **shape) -> QueuedJob:
    return QueuedJob(job_id, tenant, shape.pop("gpus", 1), "A100-80GB", priority, at, **shape)


QUEUED = [
    job("a1", "team-a", 1.0),
    job("b1", "team-b", 2.0),
    job("a2", "team-a", 3.0, priority=50),
    job("g1", "visitor", 0.5),  # not in the file: charged to the guest tenant team-b
    job("x1", "team-a", 0.1, mig_profile="bogus"),  # cannot be charged at all
]


def test_positions_follow_the_cycles_fair_share_order_not_submission_order():
    entries = rank_cohort(TENANCY, "acme", FULL, HISTORY, QUEUED, NOW)
    assert [(e.job_id, e.position, e.ahead_higher_priority) for e in entries] == [
        ("a2", 1, 0),  # higher priority class first
        ("g1", 2, 1),  # then the lower dominant share (team-b, charged for the guest) before team-a
        ("b1", 3, 1),
        ("a1", 4, 1),  # submitted before b1 but its tenant used far more than its share
        ("x1", None, 0),  # never considered: last, without a position
    ]
    by_id = {e.job_id: e for e in entries}
    assert by_id["a1"].reason == "tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend"
    assert by_id["g1"].tenant == "visitor"
    assert by_id["g1"].reason.endswith("(tenant visitor is not in the tenancy file; charged to team-b)")
    assert by_id["x1"].reason.startswith("job cannot be charged to quota: unknown MIG profile 'bogus'")


def test_a_job_the_next_cycle_would_reserve_is_listed_first():
    # team-b holds 2 of its 4: its two jobs fit now (guaranteed work, ahead of team-a's higher class)
    usage = {"team-a": {"A100-80GB": 2 * UNITS_PER_GPU}, "team-b": {"A100-80GB": 2 * UNITS_PER_GPU}}
    entries = rank_cohort(TENANCY, "acme", usage, HISTORY, QUEUED, NOW)
    assert [(e.job_id, e.position) for e in entries if e.position] == [("g1", 1), ("b1", 2), ("a2", 3), ("a1", 4)]
    assert [e.job_id for e in entries if e.reason == NEXT_CYCLE] == ["g1", "b1"]
    assert entries[0] == QuotaQueueEntry("g1", "visitor", "acme", 1, 0, NEXT_CYCLE)


def test_the_jobs_of_higher_priority_ahead_are_counted_per_job():
    assert higher_ahead([50, 10, 50, 0, 10, 100]) == [0, 1, 0, 3, 2, 0]
    assert higher_ahead([]) == []


def test_a_wait_reads_as_one_line():
    entry = {"queue": "quota/acme", "position": 3, "ahead_higher_priority": 2, "waiting_for": "quota",
             "reason": "tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend"}
    assert describe_wait(entry) == ("#3 in quota/acme, behind 2 jobs of higher priority: "
                                    "tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend")
    assert describe_wait({**entry, "position": None, "ahead_higher_priority": 0}) == (
        "waiting for quota: tenant team-a at quota (2/2 A100-80GB) and cohort has nothing to lend")
