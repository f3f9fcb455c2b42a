"""Job arrays and dependencies (pure cores): the array syntax, each task's spec and environment, the cap
quota applies, and when a job that waits for others may go in line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common import events as ev
from gpusched_core.arrays import (
    MAX_ARRAY_TASKS,
    ArrayError,
    WaitingTask,
    array_env,
    cap_reason,
    check_task,
    compact,
    held_back,
    parse_array,
    task_specs,
)
from gpusched_core.dependencies import Known, Never, Ready, Waiting, check_after, judge, parse_after
from gpusched_core.lifecycle import JobStatus
from gpusched_core.podspec import PodSpecError, pod_array, spec_from_pod_yaml
from gpusched_core.submission import check_job

SPEC = ev.JobSpec(tenant="a", gpus=1, command=["true"])


@pytest.mark.parametrize("text, indices, cap", [
    ("0-3", (0, 1, 2, 3), None),
    ("0-99%8", tuple(range(100)), 8),
    ("1,3,5-7", (1, 3, 5, 6, 7), None),
    ("0-20:5", (0, 5, 10, 15, 20), None),
    ("7", (7,), None),
    ("3,1,1-2%1", (1, 2, 3), 1),
])
def test_array_syntax(text, indices, cap):
    request = parse_array(text)
    assert request.indices == indices and request.max_running == cap


@pytest.mark.parametrize("text, says", [
    ("", "not an index"), ("a-b", "not an index"), ("5-1", "backwards"), ("0-10:0", "step"),
    ("0-9%0", "at least 1"), ("0-9%x", "whole number"), (f"0-{MAX_ARRAY_TASKS}", "more than"),
    ("0-2000000", "indices go up to"), ("-1", "not an index"),
])
def test_bad_arrays_say_why(text, says):
    with pytest.raises(ArrayError, match=says):
        parse_array(text)


@given(st.sets(st.integers(0, 500), min_size=1, max_size=60))
def test_compact_reads_back_as_the_same_indices(indices):
    assert parse_array(compact(indices)).indices == tuple(sorted(indices))


def test_each_task_is_its_own_job_and_learns_its_index():
    tasks = task_specs(SPEC, "j-arr", parse_array("0-2%2"))
    assert [job_id for job_id, _ in tasks] == ["j-arr.0", "j-arr.1", "j-arr.2"]
    _, second = tasks[1]
    assert second.array == ev.ArrayTask(array_id="j-arr", index=1, size=3, max_running=2)
    assert array_env(second.array) == {"GPUSCHED_ARRAY_JOB_ID": "j-arr", "GPUSCHED_ARRAY_INDEX": "1",
                                       "GPUSCHED_ARRAY_TASK_COUNT": "3"}
    assert array_env(None) == {}
    assert all(check_job(job_id, spec) == () for job_id, spec in tasks)


def test_a_task_must_be_the_job_it_names():
    task = ev.ArrayTask(array_id="j-arr", index=4, size=5)
    assert check_task("j-arr.4", task) == []
    assert any("is job j-arr.4, not j-other" in r for r in check_task("j-other", task))
    assert any("must not" in r for r in check_task("a.b.4", ev.ArrayTask(array_id="a.b", index=4, size=5)))
    assert any("outside" in r for r in check_task("j.0", ev.ArrayTask(array_id="j", index=0, size=0)))


def _task(index: int, array: str = "A", cap: int = 2) -> WaitingTask:
    return WaitingTask(f"{array}.{index}", array, index, cap)


def test_the_cap_lets_the_lowest_indices_fill_the_free_places():
    waiting = [_task(i) for i in (5, 3, 9, 4)]
    assert held_back(waiting, {}) == {"A.5": cap_reason("A", 2), "A.9": cap_reason("A", 2)}
    assert set(held_back(waiting, {"A": 1})) == {"A.4", "A.5", "A.9"}
    assert set(held_back(waiting, {"A": 2})) == {"A.3", "A.4", "A.5", "A.9"}
    assert set(held_back(waiting, {"A": 7})) == {"A.3", "A.4", "A.5", "A.9"}  # more than the cap: none


def test_arrays_are_capped_apart():
    held = held_back([_task(0, "A", 1), _task(1, "A", 1), _task(0, "B", 1), _task(1, "B", 1)], {"B": 1})
    assert held == {"A.1": cap_reason("A", 1), "B.0": cap_reason("B", 1), "B.1": cap_reason("B", 1)}


@given(st.lists(st.integers(0, 50), unique=True, min_size=1, max_size=30), st.integers(1, 10), st.integers(0, 12))
def test_never_more_than_the_cap_are_offered(indices, cap, active):
    waiting = [_task(i, cap=cap) for i in indices]
    offered = len(waiting) - len(held_back(waiting, {"A": active}))
    assert offered == max(0, min(len(waiting), cap - active))


def _deps(*pairs: str) -> list[ev.Dependency]:
    return [parse_after(p) for p in pairs]


@pytest.mark.parametrize("after, known, verdict", [
    (["j1"], {"j1": Known("a", JobStatus.SUCCEEDED)}, Ready()),
    (["j1:any"], {"j1": Known("a", JobStatus.FAILED)}, Ready()),
    (["j1:any"], {"j1": Known("a", JobStatus.CANCELLED)}, Ready()),
    (["j1"], {"j1": Known("a", JobStatus.RUNNING)}, Waiting(("j1",), "waiting for j1 to succeed")),
    (["j1"], {"j1": Known("a", JobStatus.PREEMPTED)}, Waiting(("j1",), "waiting for j1 to succeed")),
    (["j1"], {"j1": None}, Waiting(("j1",), "waiting for j1 to succeed")),
    (["j1", "j2:any"], {"j1": Known("a", JobStatus.QUEUED), "j2": Known("a", JobStatus.RUNNING)},
     Waiting(("j1", "j2"), "waiting for j1 to succeed; j2 to end")),
    (["j1", "j2"], {"j1": Known("a", JobStatus.SUCCEEDED), "j2": Known("a", JobStatus.RUNNING)},
     Waiting(("j2",), "waiting for j2 to succeed")),
])
def test_when_a_dependant_may_go_in_line(after, known, verdict):
    assert judge("a", _deps(*after), known) == verdict


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REJECTED])
def test_a_failed_ok_dependency_means_never(status):
    verdict = judge("a", _deps("j1", "j2"), {"j1": Known("a", JobStatus.RUNNING), "j2": Known("a", status)})
    assert isinstance(verdict, Never) and f"j2 ended {status.value}" in verdict.reason


def test_another_tenant_s_job_is_no_dependency():
    verdict = judge("a", _deps("j1"), {"j1": Known("b", JobStatus.RUNNING)})
    assert verdict == Never("dependency j1 is not a job of tenant a")


def test_dependency_lists_are_checked():
    assert check_after("j0", _deps("j1", "j2:any")) == []
    assert "cannot wait for itself" in " ".join(check_after("j0", _deps("j0")))
    assert "named twice" in " ".join(check_after("j0", _deps("j1", "j1:any")))
    assert "at most" in " ".join(check_after("j0", [ev.Dependency(job_id=f"j{i}") for i in range(1, 70)]))
    assert "not a valid job id" in " ".join(check_after("j0", [ev.Dependency(job_id="bad id")]))


@pytest.mark.parametrize("text, job_id, condition", [
    ("j-1", "j-1", "ok"), ("j-1:ok", "j-1", "ok"), ("j-1:any", "j-1", "any"), ("a:b:any", "a:b", "any"),
])
def test_after_syntax(text, job_id, condition):
    assert parse_after(text) == ev.Dependency(job_id=job_id, condition=condition)


def test_pod_annotations_carry_arrays_and_dependencies():
    pod = """metadata: {namespace: a, annotations: {gpusched.io/array: "0-9%3", gpusched.io/after: "j-1, j-2:any"}}
spec: {containers: [{command: [train]}]}"""
    assert pod_array(pod) == "0-9%3"
    assert spec_from_pod_yaml(pod).after == _deps("j-1", "j-2:any")
    with pytest.raises(PodSpecError, match="gpusched.io/after"):
        spec_from_pod_yaml(pod.replace("j-1, j-2:any", ":any"))
    assert pod_array("spec: {containers: []}") is None
