"""The workload reader's parts (``gpusched_core.workloads``): the strict YAML reader's bounds, exact
quantities (a hypothesis property: every generated Decimal with every suffix or exponent reads back as
itself), the kinds' edge cases, that no input is ever a traceback, and the gateway's use of it."""

from __future__ import annotations

from decimal import Decimal, localcontext

import pytest
from hypothesis import assume, given, settings, strategies as st

from gpusched_core.podspec import PodSpecError, pod_array, spec_from_pod_yaml
from gpusched_core.workloads import UNBOUND_TENANT, WorkloadError, named_namespace, read_workloads
from gpusched_core.workloads.quantities import (MAX_VALUE, SUFFIXES, QuantityError, ceil, cpu_milli, memory_mib,
                                                parse_quantity, whole_count)
from gpusched_core.workloads.yamlread import MAX_BYTES, MAX_DEPTH, MAX_VALUES, YamlProblem, documents
from services.gateway import core

POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team}
spec:
  containers: [{name: c, image: "cuda:12", resources: {limits: {nvidia.com/gpu: 1}}}]
"""


def problems(text: str | bytes, **kwargs) -> list[str]:
    with pytest.raises(WorkloadError) as info:
        read_workloads(text, **kwargs)
    return list(info.value.problems)


# --- the strict YAML reader ------------------------------------------------------------------------------

def test_duplicate_keys_name_the_key_and_both_lines():
    with pytest.raises(YamlProblem, match=r"line 3, column 1: duplicate key 'a' \(first at line 1\)"):
        list(documents("a: 1\nb: 2\na: 3\n"))


def test_an_anchor_without_alias_is_harmless_but_an_alias_is_refused():
    assert list(documents("a: &x 1\n")) == [(1, {"a": 1})]
    with pytest.raises(YamlProblem, match=r"alias \*x: anchors and aliases are not supported"):
        list(documents("a: &x [1]\nb: *x\n"))


def test_nesting_is_bounded():
    assert list(documents("[" * MAX_DEPTH + "]" * MAX_DEPTH))
    with pytest.raises(YamlProblem, match=f"nested deeper than {MAX_DEPTH}"):
        list(documents("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)))
    with pytest.raises(YamlProblem, match="nested deeper"):  # far deeper than Python's recursion limit
        list(documents("- " * 5000 + "x\n"))


def test_size_is_bounded_before_parsing_and_a_bom_is_read():
    with pytest.raises(YamlProblem, match="at most 1,048,576"):
        list(documents(b"#" * (MAX_BYTES + 1)))
    assert list(documents("\ufeffa: 1\n".encode())) == [(1, {"a": 1})]


def test_the_values_of_a_file_are_bounded():
    assert list(documents("[" + "1," * (MAX_VALUES - 2) + "1]"))
    with pytest.raises(YamlProblem, match="more than 100,000 keys and values"):
        list(documents("a: [" + "1," * MAX_VALUES + "1]"))


def test_documents_keep_their_number_in_the_file_and_empty_ones_are_skipped():
    assert list(documents("---\n---\na: 1\n---\n# nothing\n---\nb: 2\n")) == [(2, {"a": 1}), (4, {"b": 2})]
    assert problems("---\n# nothing\n") == ["the file defines no job (it has no document)"]


def test_a_syntax_error_names_its_document():
    assert problems(POD + "---\na: [\n")[0].startswith("document 2: line 8")


# --- quantities ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, exact", [
    ("129e6", Decimal(129_000_000)), ("1E3", Decimal(1000)), ("1E", Decimal(10**18)), (4.03, Decimal("4.03")),
    ("4.03", Decimal("4.03")), ("1.5Gi", Decimal(3 * 2**29)), ("100m", Decimal("0.1")), ("5e-3", Decimal("0.005")),
    (".5", Decimal("0.5")), ("1.", Decimal(1)), ("7Ki", Decimal(7168)), ("3n", Decimal("3e-9")), (2, Decimal(2)),
])
def test_every_suffix_and_exponent_is_exact(value, exact):
    assert parse_quantity(value) == exact


def test_cpu_and_memory_round_up_exactly():
    assert (cpu_milli(4.03), cpu_milli("4.03"), cpu_milli("0.0001"), cpu_milli("100m")) == (4030, 4030, 1, 100)
    assert (memory_mib("129e6"), memory_mib("1.5Gi"), memory_mib("1Mi"), memory_mib("1048577")) == (124, 1536, 1, 2)


@pytest.mark.parametrize("value, reason", [
    ("-1", "no sign"), ("+2", "no sign"), (-3, "no sign"), ("1e", "not a quantity"), ("1E3m", "not a quantity"),
    ("2 cores", "not a quantity"), (True, "a boolean"), (None, "null"), ([1], "a list"), (float("nan"), "nan"),
    ("1e41", "exponent is out of range"), ("9Ei", "too large"), ("1" * 65, "at most 64 characters"),
])
def test_what_is_no_quantity_says_why(value, reason):
    with pytest.raises(QuantityError, match=reason):
        parse_quantity(value)


def test_device_counts_are_whole_numbers():
    assert (whole_count(2), whole_count("2"), whole_count(2.0), whole_count("1k")) == (2, 2, 2, 1000)
    for value in (1.5, "1.5", "500m"):
        with pytest.raises(QuantityError, match="whole number"):
            whole_count(value)


@settings(max_examples=300, deadline=None)
@given(value=st.decimals(min_value=0, max_value=10**12, places=9, allow_nan=False, allow_infinity=False),
       suffix=st.sampled_from(sorted(SUFFIXES)), power=st.integers(-20, 20), exponent=st.booleans())
def test_quantities_read_back_exactly_as_generated(value, suffix, power, exponent):
    with localcontext() as context:
        context.prec = 200
        text, exact = (f"{value:f}e{power}", value.scaleb(power)) if exponent else (f"{value:f}{suffix}",
                                                                                  value * SUFFIXES[suffix])
        assume(exact <= MAX_VALUE)
        assert parse_quantity(text) == exact
        assert cpu_milli(text) == ceil(exact * 1000)
        assert memory_mib(text) == ceil(exact / 2**20)


# --- kinds and fields ------------------------------------------------------------------------------------

def test_a_pod_spec_with_an_image_and_no_command_runs_its_entrypoint():
    spec = spec_from_pod_yaml(POD)
    assert (spec.image, spec.command, spec.gpus, spec.tenant) == ("cuda:12", [], 1, "team")


def test_the_tenant_and_priority_given_override_the_file():
    [workload] = read_workloads(POD.replace("containers:", "priority: 5\n  containers:"), tenant="other", priority=9)
    assert (workload.spec.tenant, workload.spec.priority) == ("other", 9)


def test_a_file_without_a_tenant_can_be_read_for_the_caller_s():
    [workload] = read_workloads(POD.replace("namespace: team", "labels: {}"), tenant_required=False)
    assert workload.spec.tenant == UNBOUND_TENANT and workload.as_dict()["spec"]["tenant"] is None
    assert named_namespace(POD) == "team" and named_namespace("a: [") is None


def test_a_gang_annotation_must_agree_with_the_replicas():
    pytorchjob = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: x, namespace: t, annotations: {gpusched.io/gang-nodes: "3"}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template: {spec: {containers: [{name: pytorch, image: "pt:2", resources: {limits: {nvidia.com/gpu: 2}}}]}}
"""
    assert problems(pytorchjob) == ['document 1 (kubeflow.org/v1 PyTorchJob x): metadata.annotations["gpusched.io/gang-nodes"]: '
                                    "3 nodes, but the replicas make a gang of 2"]
    [workload] = read_workloads(pytorchjob.replace('"3"', '"2"'))
    assert (workload.spec.nodes, workload.spec.gpus, workload.spec.kind) == (2, 2, "gang")


def test_the_pytorch_container_is_the_one_that_runs():
    pytorchjob = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: x, namespace: t}
spec:
  pytorchReplicaSpecs:
    Master:
      template:
        spec:
          containers:
          - {name: sidecar, image: "log:1"}
          - {name: pytorch, image: "pt:2", command: [torchrun, t.py], resources: {limits: {nvidia.com/gpu: 1}}}
"""
    [workload] = read_workloads(pytorchjob)
    assert (workload.spec.image, workload.spec.command, workload.spec.nodes) == ("pt:2", ["torchrun", "t.py"], 1)
    assert any("containers[0]: not run" in w for w in workload.warnings)


def test_a_jobset_s_completions_must_equal_its_parallelism():
    jobset = """apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js, namespace: t}
spec:
  replicatedJobs:
  - name: w
    template:
      spec:
        parallelism: 2
        completions: 4
        template: {spec: {containers: [{name: c, image: "x:1"}]}}
"""
    assert "completions = parallelism" in problems(jobset)[0]


def test_a_bad_array_annotation_is_named():
    text = POD.replace("namespace: team}", 'namespace: team, annotations: {gpusched.io/array: "9-1"}}')
    assert problems(text) == ['document 1 (v1 Pod p): metadata.annotations["gpusched.io/array"]: array \'9-1\': '
                              "range '9-1' runs backwards or has a step under 1"]


def test_one_job_is_what_spec_from_pod_yaml_takes():
    with pytest.raises(PodSpecError, match="defines 2 jobs"):
        spec_from_pod_yaml(POD + "---\n" + POD)
    job = POD.replace("apiVersion: v1\nkind: Pod", "apiVersion: batch/v1\nkind: Job").replace(
        "spec:\n  containers", "spec:\n  completions: 3\n  template:\n   spec:\n    containers")
    assert pod_array(job) == "0-2%1" and pod_array("a: [") is None


_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                           st.sampled_from(["containers", "resources", "limits", "requests", "env", "name", "value",
                                            "image", "command", "template", "spec", "metadata", "annotations",
                                            "nvidia.com/gpu", "cpu", "affinity", "nodeSelector", "replicas"]),
                           inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from([("v1", "Pod"), ("batch/v1", "Job"), ("kubeflow.org/v1", "PyTorchJob"),
                             ("jobset.x-k8s.io/v1alpha2", "JobSet"), (None, None)]), spec=_VALUES, meta=_VALUES)
def test_no_document_is_ever_a_traceback(kind, spec, meta):
    import json
    doc = {"spec": spec, "metadata": meta, **({"apiVersion": kind[0], "kind": kind[1]} if kind[0] else {})}
    try:
        read_workloads(json.dumps(doc))
    except WorkloadError as exc:
        assert exc.problems and all(isinstance(p, str) and p.startswith("document 1") for p in exc.problems)


# --- the gateway -----------------------------------------------------------------------------------------

def test_the_gateway_takes_one_workload_with_its_array_and_warnings():
    text = POD.replace("containers:", "tolerations: [{key: a}]\n  containers:")
    spec, array, warnings = core.build_job("yaml", text, "team")
    assert (spec.tenant, array, warnings) == ("team", None, ("spec.tolerations: ignored: gpusched does not taint nodes",))
    assert core.named_tenant("yaml", POD) == "team"
    with pytest.raises(core.BadBody) as info:
        core.build_job("yaml", POD + "---\n" + POD, "team")
    assert info.value.status == 422 and "gpusched submit -f" in info.value.reasons[0]
    with pytest.raises(core.BadBody) as info:
        core.build_job("yaml", "a: 1\na: 2\n", "team")
    assert info.value.reasons == ("document 1: line 2, column 1: duplicate key 'a' (first at line 1)",)
