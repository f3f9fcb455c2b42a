"""The pre-submission check's core (``gpusched_core.check``): one hypothetical job judged against a cluster,
quota usage and running jobs by the admission, quota, placement and preemption cores. A scenario table:
start, preempt, wait for quota (at quota, behind the tenant's queue, no tenancy), wait for capacity, and
never (too many GPUs, an unknown model, no node large enough, over the tenant's limit)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import pytest

from gpusched_core import placement as engine
from gpusched_core import preemption as sel
from gpusched_core.check import CheckInputs, check_submission
from gpusched_core.estimates import Forward, Hold, NodeGpus, RunningJob, Shape, WaitingJob, wait_words, with_new_job
from gpusched_core.gpu_models import ModelView
from gpusched_core.placement.cycle import GpuRow, NodeRow, PendingPlacement, build_cluster
from gpusched_core.quota import UNITS_PER_GPU, BlockedWork, load_tenancy
from gpusched_core.quota.jobs import QueuedJob
from tests.builders import T0, a_job

TENANCY = load_tenancy("""
version: 1
revision: 1
flavors: [H100-80GB, A100-80GB]
priority_classes: {high: 100, low: 10}
default_priority_class: low
tenants:
  - name: a
    priority_classes: [high, low]
    quota: {H100-80GB: {nominal: 4}, A100-80GB: {nominal: 8}}
  - name: b
    priority_classes: [high, low]
    quota: {H100-80GB: {nominal: 8}}
""")
MODELS = ModelView({"H100-80GB": 81559, "A100-80GB": 81920})
NOW_S = T0.timestamp()


def node(node_id: str, gpus: int, model: str = "H100-80GB") -> NodeRow:
    return NodeRow(node_id, 64_000, 512_000, tuple(GpuRow(i, f"{node_id}-{i}", model, 81559) for i in range(gpus)),
                   {engine.MODEL_LABEL: model})


@dataclass(frozen=True)
class Cluster:
    """Nodes, who holds which GPUs (job id -> (tenant, priority, [(node, index)])), quota usage, queues."""

    nodes: tuple[NodeRow, ...] = (node("n1", 8),)
    held: dict[str, tuple[str, int, list[tuple[str, int]]]] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    queued: tuple[QueuedJob, ...] = ()
    pending: tuple[PendingPlacement, ...] = ()
    tenancy: object = TENANCY

    def holding(self, job_id: str, tenant: str, priority: int, gpus: list[tuple[str, int]]) -> Cluster:
        return replace(self, held={**self.held, job_id: (tenant, priority, gpus)})

    def forward(self, limit_s: dict[str, float], waiting: tuple[WaitingJob, ...] = ()) -> Forward:
        """The queue as the estimator reads it: every holder started an hour ago with its time limit."""
        nodes = tuple(NodeGpus(n.node_id, n.gpus[0].model, tuple(g.index for g in n.gpus)) for n in self.nodes)
        running = tuple(RunningJob(j, t, Shape(len(g), 1, "H100-80GB"), NOW_S - 3600,
                                   tuple(Hold(n, i) for n, i in g), limit_s.get(j))
                        for j, (t, _, g) in sorted(self.held.items()))
        return Forward(nodes, running, waiting)

    def inputs(self, spec) -> CheckInputs:
        snapshot = build_cluster(list(self.nodes), {j: g for j, (_, _, g) in self.held.items()}, {})
        running = [sel.RunningJob(j, t, p, NOW_S - 3600, (j,), units=len(g) * UNITS_PER_GPU, flavor="H100-80GB")
                   for j, (t, p, g) in sorted(self.held.items())]
        return CheckInputs("check-1", spec, T0, engine.make_policy("bestfit"), models=MODELS,
                           tenancy=self.tenancy, usage=self.usage, queued=self.queued, nodes=self.nodes,
                           snapshot=snapshot, pending=self.pending, running=running,
                           selection=sel.SelectionConfig(default_min_runtime_s=60.0, cross_tenant="any"))


def gpus(node_id: str, *indices: int) -> list[tuple[str, int]]:
    return [(node_id, i) for i in indices]


EMPTY = Cluster()
TWO_HELD = EMPTY.holding("x", "b", 10, gpus("n1", 0, 1))
FULL_OF_LOW = Cluster(nodes=(node("n1", 4),)).holding("low-1", "b", 10, gpus("n1", 0, 1)).holding(
    "low-2", "b", 10, gpus("n1", 2, 3))
FULL_OF_HIGH = EMPTY.holding("high-1", "b", 100, gpus("n1", 0, 1, 2, 3, 4, 5))
A_AT_QUOTA = replace(EMPTY.holding("mine", "a", 10, gpus("n1", 0, 1, 2, 3)),
                     usage={"a": {"H100-80GB": 4 * UNITS_PER_GPU}})
A_QUEUED = Cluster(usage={"a": {"H100-80GB": 2 * UNITS_PER_GPU}},
                   queued=(QueuedJob("a-early", "a", 2, "H100-80GB", 10, NOW_S - 60),))
A100_SMALL = Cluster(nodes=(node("n1", 8), node("n2", 4, "A100-80GB")))
H100 = a_job("j").tenant("a").model("H100-80GB")

SCENARIOS = [
    pytest.param(TWO_HELD, H100.gpus(4), "start", "would start now on n1 GPUs 2-5", id="start"),
    pytest.param(FULL_OF_LOW, H100.gpus(4).priority(100), "preempt",
                 "would start after preempting 2 jobs (low-1, low-2) of lower priority on n1 GPUs 0-3", id="preempt"),
    pytest.param(A_AT_QUOTA, H100.gpus(1), "wait",
                 "would wait: tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend",
                 id="wait-tenant-at-quota"),
    pytest.param(A_QUEUED, H100.gpus(2), "wait",
                 "would wait: tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend",
                 id="wait-behind-the-tenant-s-queue"),
    pytest.param(replace(EMPTY, tenancy=None), H100.gpus(1), "wait",
                 "would wait: no tenancy is in force yet: quota reserves nothing until an operator installs one",
                 id="wait-no-tenancy"),
    pytest.param(FULL_OF_HIGH, H100.gpus(4), "wait",
                 "would wait: no free capacity: needs 4 GPUs of H100-80GB on one node, the most free on a node is 2",
                 id="wait-for-capacity"),
    pytest.param(EMPTY, H100.gpus(16), "never", "can never run here: gpus 16 exceeds the limit of 8 GPUs per node",
                 id="never-too-many-gpus"),
    pytest.param(EMPTY, H100.model("Z900-1GB"), "never", "can never run here: unknown GPU model 'Z900-1GB'",
                 id="never-unknown-model"),
    pytest.param(A100_SMALL, a_job("j").tenant("a").model("A100-80GB").gpus(8), "never",
                 "can never run here: no node has 8 GPUs of A100-80GB (the most on a node is 4)",
                 id="never-no-node-large-enough"),
    pytest.param(EMPTY, H100.gpus(8), "never",
                 "can never run here: job needs 8 H100-80GB but tenant a can never hold more than 4",
                 id="never-over-the-tenant-s-limit"),
    pytest.param(EMPTY, H100.selector({"zone": "x"}), "never",
                 "can never run here: no node could ever host it: 1 node: node selector zone=x does not match",
                 id="never-no-node-matches-its-selector"),
    pytest.param(EMPTY, a_job("j").tenant("zed").gpus(1), "never",
                 "can never run here: tenant zed is not in the tenancy file", id="never-unknown-tenant"),
]


@pytest.mark.parametrize(("cluster", "job", "verdict", "summary"), SCENARIOS)
def test_a_check_answers_as_the_cores_would_decide(cluster, job, verdict, summary):
    result = check_submission(cluster.inputs(job.spec()))
    assert result.verdict == verdict, result.document()
    assert result.summary.startswith(summary), result.summary
    document = result.document()
    assert set(document) == {"verdict", "summary", "reasons", "stages", "placement", "victims", "estimated_start",
                             "estimated_wait_s", "estimate"}
    assert set(document["stages"]) == {"admission", "quota", "placement", "preemption"}
    starts = verdict in ("start", "preempt")  # now; a wait's estimate needs the queue (``forward``)
    assert document["estimated_start"] == (T0.isoformat() if starts else None)
    assert document["estimated_wait_s"] == (0.0 if starts else None)
    if verdict in ("wait", "never"):
        assert document["reasons"] and document["summary"].endswith(document["reasons"][0])


def test_a_start_says_where_and_every_stage_passed():
    document = check_submission(TWO_HELD.inputs(H100.gpus(4).spec())).document()
    assert document["placement"]["node_id"] == "n1" and document["placement"]["gpu_indices"] == [2, 3, 4, 5]
    assert document["victims"] is None and document["stages"]["preemption"] is None
    assert [document["stages"][s]["ok"] for s in ("admission", "quota", "placement")] == [True, True, True]
    assert document["stages"]["quota"]["flavor"] == "H100-80GB" and document["stages"]["quota"]["used_gpus"] == "0"


def test_a_preemption_names_its_victims_and_the_slot():
    document = check_submission(FULL_OF_LOW.inputs(H100.gpus(4).priority(100).spec())).document()
    assert [v["job_id"] for v in document["victims"]] == ["low-1", "low-2"]
    assert document["placement"]["gpu_indices"] == [0, 1, 2, 3]
    assert document["stages"]["preemption"]["outcome"] == "preempt"


def test_a_job_of_equal_priority_waits_rather_than_preempts():
    result = check_submission(FULL_OF_LOW.inputs(H100.gpus(4).priority(10).spec()))
    assert result.verdict == "wait" and result.preemption is not None and not result.preemption.ok
    assert any("no running job may be preempted" in r for r in result.reasons), result.reasons


def test_admission_gives_every_reason_and_the_later_stages_are_not_reached():
    result = check_submission(EMPTY.inputs(H100.gpus(16).priority(7777).spec()))
    assert result.verdict == "never" and len(result.reasons) == 2, result.reasons
    assert result.quota.ok is None and result.placement_stage.ok is None and result.preemption is None


def test_waiting_for_quota_also_says_when_there_is_no_room():
    cluster = replace(FULL_OF_HIGH, usage={"a": {"H100-80GB": 4 * UNITS_PER_GPU}})
    result = check_submission(cluster.inputs(H100.gpus(4).spec()))
    assert result.verdict == "wait" and result.quota.ok is False and result.placement_stage.ok is False
    assert len(result.reasons) >= 2 and "no free capacity" in " ".join(result.reasons)


def test_jobs_ahead_in_placement_s_queue_are_placed_first():
    ahead = PendingPlacement("p-1", 6, "H100-80GB", 100, 1, T0)
    result = check_submission(replace(TWO_HELD, pending=(ahead,)).inputs(H100.gpus(4).spec()))
    assert result.verdict == "wait" and result.placement_stage.facts["placed_ahead"] == ["p-1"]
    assert any("p-1" in r for r in result.reasons)


def test_the_jobs_the_tenant_queued_ahead_get_quota_first():
    result = check_submission(A_QUEUED.inputs(H100.gpus(2).spec()))
    assert result.quota.facts["reserved_ahead"] == ["a-early"] and result.quota.facts["queued_ahead"] == 1
    assert "queued ahead of it: a-early" in result.reasons[1]
    alone = check_submission(replace(A_QUEUED, queued=()).inputs(H100.gpus(2).spec()))
    assert alone.verdict == "start"


def test_unfinished_dependencies_make_it_wait_and_unknown_ones_are_never():
    inputs = EMPTY.inputs(H100.gpus(1).spec())
    assert check_submission(replace(inputs, waiting_on=("dep-1",))).verdict == "wait"
    never = check_submission(replace(inputs, unknown_dependencies=("ghost",)))
    assert never.verdict == "never" and never.reasons == ("no job ghost to wait for",)


COHORT = load_tenancy("""
version: 1
flavors: [H100-80GB]
priority_classes: {low: 10}
default_priority_class: low
tenants:
  - name: org
    priority_classes: [low]
    children:
      - {name: a, quota: {H100-80GB: {nominal: 8}}}
      - {name: b, quota: {H100-80GB: {nominal: 8}}}
""")


def test_a_job_fair_backfill_would_hold_back_waits_and_says_so():
    """a's 4-GPU job holds quota and waits for room, and a queued 8 more (entitled to 9 of 16 GPUs, at 0.44);
    b holds 6 on n1: a 1-GPU job fits b's quota and n1, but takes b to 7 of its 7 (1.0, past 1.5 x 0.44)."""
    cluster = replace(EMPTY.holding("b-six", "b", 10, gpus("n1", 0, 1, 2, 3, 4, 5)), tenancy=COHORT,
                      usage={"a": {"H100-80GB": 4 * UNITS_PER_GPU}, "b": {"H100-80GB": 6 * UNITS_PER_GPU}},
                      queued=(QueuedJob("a-more", "a", 8, "H100-80GB", 10, NOW_S - 60),))
    inputs = cluster.inputs(a_job("j").tenant("b").model("H100-80GB").gpus(1).spec())
    held = check_submission(replace(inputs, blocked=(BlockedWork("a", "H100-80GB", 10),), fair_margin=0.5))
    assert held.verdict == "wait" and held.quota.facts["category"] == "fair_share", held.reasons
    assert held.reasons[0].startswith("fair share: tenant b would reach 1.00 of its fair share, past 0.67")
    assert check_submission(replace(inputs, blocked=(BlockedWork("a", "H100-80GB", 10),))).verdict == "start"
    assert check_submission(replace(inputs, fair_margin=0.5)).verdict == "start"  # nothing waits for room


def test_the_check_is_pure_the_same_inputs_give_the_same_answer():
    inputs = FULL_OF_LOW.inputs(H100.gpus(4).priority(100).spec())
    assert check_submission(inputs).document() == check_submission(inputs).document()


# --- gpusched submit --check ------------------------------------------------------------------------------


class CheckingGateway:
    """A gateway that answers every check with the core's verdict on ``CLUSTER`` (and records each body)."""

    checked: list[dict] = []

    @classmethod
    def from_config(cls) -> CheckingGateway:
        return cls()

    def __enter__(self) -> CheckingGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def check(self, body: dict) -> dict:
        self.checked.append(body)
        spec = a_job("j").tenant("a").spec().model_validate({"tenant": "a", **body})
        return check_submission(FULL_OF_LOW.inputs(spec)).document()


@pytest.mark.parametrize(("flags", "code", "first_line"), [
    pytest.param(["--gpus", "2"], 3, "would wait: no free capacity: needs 2 GPUs", id="wait-is-3"),
    pytest.param(["--gpus", "4", "--priority", "100"], 0, "would start after preempting 2 jobs", id="preempt-is-0"),
    pytest.param(["--gpus", "9"], 2, "can never run here: gpus 9 exceeds", id="never-is-2"),
])
def test_submit_check_prints_the_summary_and_each_stage_and_exits_by_verdict(monkeypatch, capsys, flags, code,
                                                                            first_line):
    from gpusched_cli import job_commands
    from gpusched_cli.main import main

    CheckingGateway.checked = []
    monkeypatch.setattr(job_commands, "Client", CheckingGateway)
    assert main(["submit", "--check", "--gpu-model", "H100-80GB", *flags, "--", "true"]) == code
    out = capsys.readouterr().out
    assert out.startswith(first_line), out
    assert "stage" in out and "admission" in out and "quota" in out
    priority = {"priority": 100} if "--priority" in flags else {}
    assert CheckingGateway.checked == [{"gpus": int(flags[1]), "nodes": 1, "command": ["true"],
                                        "gpu_model": "H100-80GB", **priority}]


def test_submit_check_json_is_the_gateway_s_answer(monkeypatch, capsys):
    from gpusched_cli import job_commands
    from gpusched_cli.main import main

    monkeypatch.setattr(job_commands, "Client", CheckingGateway)
    assert main(["submit", "--check", "--json", "--gpus", "4", "--priority", "100", "--", "true"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["verdict"] == "preempt" and [v["job_id"] for v in answer["victims"]] == ["low-1", "low-2"]


# --- the estimated start ----------------------------------------------------------------------------------


def estimated(cluster: Cluster, spec, limit_s: dict[str, float], waiting: tuple[WaitingJob, ...] = ()):
    return check_submission(replace(cluster.inputs(spec), forward=cluster.forward(limit_s, waiting)))


def test_a_job_at_its_tenant_s_quota_is_estimated_to_start_when_the_tenant_s_run_ends():
    result = estimated(A_AT_QUOTA, H100.gpus(1).spec(), {"mine": 3600 + 1500})  # ends in 25 min
    assert result.verdict == "wait" and result.estimated_wait_s == 1500.0, result.document()
    assert result.summary == ("would wait: tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend; "
                              "estimated start in ~25 min")
    document = result.document()
    assert document["estimated_start"] == "2026-01-01T00:25:00+00:00"
    assert document["estimate"]["reason"] == "once a running job ends"
    assert document["reasons"][0] == "tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend"


def test_a_job_waiting_for_capacity_starts_when_enough_gpus_free_up():
    result = estimated(FULL_OF_HIGH, H100.gpus(4).spec(), {"high-1": 3600 + 2 * 3600})
    assert result.verdict == "wait" and result.estimated_wait_s == 7200.0, result.document()
    assert result.summary.endswith("; estimated start in ~2 h")


def test_a_start_is_now_a_never_has_no_estimate_and_a_dependency_leaves_it_unknown():
    start = estimated(TWO_HELD, H100.gpus(4).spec(), {})
    assert start.estimated_start == T0 and start.estimated_wait_s == 0.0
    never = estimated(EMPTY, H100.gpus(16).spec(), {})
    assert never.verdict == "never" and never.document()["estimated_start"] is None
    inputs = replace(A_AT_QUOTA.inputs(H100.gpus(1).spec()), forward=A_AT_QUOTA.forward({"mine": 4000}),
                     waiting_on=("dep-1",))
    waits = check_submission(inputs)
    assert waits.verdict == "wait" and waits.estimated_start is None and "estimated" not in waits.summary


def test_the_jobs_queued_ahead_of_it_for_quota_start_first():
    ahead = WaitingJob("a-early", "a", Shape(4, 1, "H100-80GB"), NOW_S - 60, 10, 1, 1800.0)
    cluster = replace(A_AT_QUOTA, queued=(QueuedJob("a-early", "a", 4, "H100-80GB", 10, NOW_S - 60),))
    result = estimated(cluster, H100.gpus(4).spec(), {"mine": 3600 + 600}, (ahead,))
    assert result.quota.ahead == ("a-early",)
    assert result.verdict == "wait" and result.estimated_wait_s == 600.0 + 1800.0, result.document()


def test_the_new_job_waits_after_the_jobs_quota_puts_ahead_of_it_and_with_placement_s_queue_when_reserved():
    def w(job_id: str, reserved: str | None = None) -> WaitingJob:
        return WaitingJob(job_id, "a", Shape(), NOW_S, reserved_model=reserved)
    queue = (w("p1", "H100-80GB"), w("q1"), w("q2"), w("q3"))
    assert [j.job_id for j in with_new_job(queue, w("new"), {"q1", "q2"})[1]] == ["p1", "q1", "q2", "new", "q3"]
    assert with_new_job(queue, w("new"), set())[0] == 1
    assert with_new_job(queue, w("new", "H100-80GB"), {"q1"})[0] == 1


@pytest.mark.parametrize(("wait_s", "words"), [(10, "in under a minute"), (1500, "in ~25 min"),
                                               (7200, "in ~2 h"), (3 * 86400, "in ~3 d")])
def test_an_estimate_is_said_roughly(wait_s, words):
    assert wait_words(wait_s) == words


def test_submit_check_prints_a_wait_s_estimated_start(monkeypatch, capsys):
    from gpusched_cli import job_commands
    from gpusched_cli.main import main

    class Estimating(CheckingGateway):
        def check(self, body: dict) -> dict:
            return estimated(A_AT_QUOTA, H100.gpus(1).spec(), {"mine": 3600 + 1500}).document()

    monkeypatch.setattr(job_commands, "Client", Estimating)
    assert main(["submit", "--check", "--gpus", "1", "--", "true"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("would wait: tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend; estimated "
                          "start in ~25 min"), out
    assert "estimated start: in 25m (2026-01-01T00:25:00+00:00; run-time from default)" in out
