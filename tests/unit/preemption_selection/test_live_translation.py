"""The live service's pure translations: a gang victim is told to stop on every node, a job's shape
becomes its placement request, and a quota reclaim request becomes the core's ask in quota units."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpusched_common import events as ev

from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.preemption.jobs import preempt_commands, quota_charge, quota_units_of, reclaim_ask, request_of

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def spec(**fields) -> ev.JobSpec:
    return ev.JobSpec(tenant="team-a", command=["true"], **{"gpus": 1, **fields})


def test_a_gang_victim_is_told_to_stop_on_every_member_node():
    state = lifecycle.JobState("g", lifecycle.JobStatus.RUNNING, node_id="n1", node_ids=("n1", "n2", "n3"))
    commands = preempt_commands(state, 30.0, T0, "reclaim")
    assert [(c.job_id, c.node_id, c.reason) for c in commands] == [("g", "n1", "reclaim"), ("g", "n2", "reclaim"),
                                                                    ("g", "n3", "reclaim")]


def test_a_single_node_victim_is_told_once_even_without_node_ids():
    state = lifecycle.JobState("j", lifecycle.JobStatus.RUNNING, node_id="n1")
    assert [c.node_id for c in preempt_commands(state, 30.0, T0, "r")] == ["n1"]


def test_the_request_follows_the_jobs_shape_and_the_reclaimed_flavor():
    gang = request_of("g", spec(gpus=8, nodes=2), "A100-80GB")
    assert isinstance(gang, engine.GangRequest) and (gang.node_count, gang.gpus_per_node) == (2, 8)
    assert gang.allowed_models == frozenset({"A100-80GB"})
    whole = request_of("w", spec(gpus=4, gpu_model="NVIDIA-H100-80GB-HBM3"))
    assert whole.gpu == engine.WholeGpus(4) and whole.allowed_models == frozenset({"H100-80GB"})
    shared = request_of("s", spec(gpu_share=ev.GpuShareSpec(milli=500, memory_mib=1024)))
    assert shared.gpu == engine.GpuShare(500, 1024) and not shared.allowed_models
    assert request_of("m", spec(mig_profile="3g.40gb")).gpu == engine.MigSlice("3g.40gb")


def test_quota_units_are_seven_thousand_per_gpu():
    assert quota_units_of(spec(gpus=8, nodes=2), "A100-80GB") == 16 * 7000
    assert quota_units_of(spec(gpu_share=ev.GpuShareSpec(milli=500)), "A100-80GB") == 3500
    assert quota_units_of(spec(mig_profile="3g.40gb"), "A100-80GB") == 3000


def test_a_reclaim_request_becomes_the_cores_ask_in_quota_units():
    request = ev.ReclaimRequested(tenant="team-a", cohort="acme", flavor="A100-80GB", gpus=4, for_jobs=["a1"],
                                  borrowers=[ev.ReclaimBorrower(tenant="team-b", borrowed_gpus=2.5)],
                                  reason="owed", requested_at=T0)
    ask = reclaim_ask(request)
    assert (ask.tenant, ask.flavor, ask.short_units, ask.borrowers) == ("team-a", "A100-80GB", 28000,
                                                                         (("team-b", 17500),))
    assert ask.requested_at_s == T0.timestamp()


@pytest.mark.parametrize(("reserved", "held", "models", "expected"), [
    pytest.param(("team-q", "A100-80GB", 3000), 1, ("A100-80GB",), ("team-q", "A100-80GB", 3000), id="reservation"),
    pytest.param((None, None, None), 2, ("H100-80GB",), ("team-a", "H100-80GB", 14000), id="no reservation, one model"),
    pytest.param((None, None, None), 2, ("H100-80GB", "A100-80GB"), ("team-a", None, 14000), id="several models"),
    pytest.param((None, None, None), 1, (), ("team-a", None, 7000), id="no model known"),
])
def test_what_quota_charges_a_running_job(reserved, held, models, expected):
    tenant, flavor, units = reserved
    assert quota_charge("team-a", held, models, reserved_tenant=tenant, reserved_flavor=flavor,
                        reserved_units=units) == expected
