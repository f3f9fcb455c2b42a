"""The fault campaign's short version (issue 15; the full one is `make chaos`): a stack of its own, 150 jobs
of every shape and one fault of each of the ten kinds from a seeded schedule; afterwards no job is lost or
stuck, none ran twice at once, no GPU was held twice, no quota overshot, no stale report was applied, the
outbox is empty, no service died, and new work ran soon after most faults' healing."""

from __future__ import annotations

from gpusched_cli.chaos import schedule as sch
from gpusched_cli.chaos.campaign import LEASE_S, Options, run_campaign, table
from gpusched_cli.chaos.faults import skew_supported

# The campaign starts its own broker of the module's kind: Tansu loses everything when it is killed, Apache
# Kafka keeps its logs (its run is in `make test-slow`).


async def test_one_fault_of_each_kind_breaks_no_invariant(tmp_path, broker_kind):
    options = Options(jobs=150, faults=len(sch.KINDS), seed=7, broker=broker_kind, drain_s=300, out=None)
    report, campaign = await run_campaign(options, tmp_path, progress=lambda line: None)
    shown = table(report, campaign.recoveries, LEASE_S + 5, campaign.exercised)
    injected = set(sch.KINDS) - ({sch.CLOCK_SKEW} if skew_supported() is not None else set())  # said why
    assert set(report.faults_by_kind) >= injected, shown
    assert report.clean, shown
    assert report.jobs == 150 and campaign.exercised["runs"] >= 140, shown
    # recovery is measured and shown (`make chaos` reports p50/p99 against lease + 5 s); a probe after the
    # broker lost its data still waits past its timeout here now and then (issue 15's note)
    assert report.recovery_p50_s is not None and report.recovery_p50_s <= LEASE_S + 5, shown
    assert not campaign.deaths, shown
