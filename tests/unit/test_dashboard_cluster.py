"""The cluster document of the dashboard (gpusched_core.dashboard.cluster): GPU states as a scenario table,
shares and MIG instances counted as their share, fits and fragmentation worked by hand, the usage samples
the metrics service writes, and properties: fits never exceed free capacity, fragmentation stays in 0..1.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.dashboard import AllocationRow, GpuRow, NodeRow, ShareRow, TelemetryRow, plan_cluster
from gpusched_core.dashboard.cluster import mig_fits
from gpusched_core.dashboard.usage import plan_usage_samples
from gpusched_core.metrics.views import GpuReading
from gpusched_core.placement.mig import MIG_FAMILIES
from tests.builders import T0

H100 = "H100-80GB"
H100_MIB = 81559


def gpus(node: str, n: int, model: str = H100, *, mig: bool = False, healthy: bool = True) -> list[GpuRow]:
    return [GpuRow(node, i, model, H100_MIB, healthy, mig) for i in range(n)]


def whole(node: str, index: int, job: str, tenant: str = "a") -> AllocationRow:
    return AllocationRow(node, index, job, tenant, 1000, 0)


def mig_instance(node: str, index: int, job: str, start: int, profile: str = "3g.40gb", slices: int = 4,
                 tenant: str = "a") -> AllocationRow:
    return AllocationRow(node, index, job, tenant, slices * 125, 40_192, profile, start, slices)


def reading(node: str, index: int, pct: float, age_s: float = 1.0, memory: int = 1000) -> TelemetryRow:
    return TelemetryRow(node, index, pct, memory, True, T0 - timedelta(seconds=age_s))


def doc(nodes, gpu_rows, allocations=(), telemetry=()):
    return plan_cluster(nodes, gpu_rows, allocations, telemetry, T0, busy_pct=5.0, stale_after_s=60.0)


def only_gpu(d: dict) -> dict:
    [node] = d["nodes"]
    return node["gpus"][0]


STATES = [
    pytest.param("Ready", True, [], [], "free", id="free-on-a-ready-node"),
    pytest.param("Cordoned", True, [], [], "cordoned", id="free-on-a-cordoned-node-is-cordoned"),
    pytest.param("Draining", True, [], [], "cordoned", id="free-on-a-draining-node-is-cordoned"),
    pytest.param("Lost", True, [], [], "cordoned", id="free-on-a-lost-node-is-cordoned"),
    pytest.param("Ready", True, [whole("n1", 0, "j1")], [reading("n1", 0, 80.0)], "busy", id="allocated-and-busy"),
    pytest.param("Ready", True, [whole("n1", 0, "j1")], [reading("n1", 0, 5.0)], "idle",
                 id="allocated-at-the-threshold-is-idle"),
    pytest.param("Ready", True, [whole("n1", 0, "j1")], [], "idle", id="allocated-without-telemetry-is-idle"),
    pytest.param("Ready", True, [whole("n1", 0, "j1")], [reading("n1", 0, 90.0, age_s=600)], "idle",
                 id="allocated-with-stale-telemetry-is-idle"),
    pytest.param("Cordoned", True, [whole("n1", 0, "j1")], [reading("n1", 0, 90.0)], "busy",
                 id="allocated-on-a-cordoned-node-is-still-busy"),
    pytest.param("Ready", False, [whole("n1", 0, "j1")], [reading("n1", 0, 90.0)], "unhealthy",
                 id="unhealthy-wins-over-everything"),
]


@pytest.mark.parametrize(("node_state", "healthy", "allocations", "telemetry", "state"), STATES)
def test_a_gpu_s_state_follows_its_health_allocations_telemetry_and_node(node_state, healthy, allocations, telemetry,
                                                                         state):
    d = doc([NodeRow("n1", "host-1", node_state)], gpus("n1", 1, healthy=healthy), allocations, telemetry)
    assert only_gpu(d)["state"] == state
    assert d["nodes"][0]["state"] == node_state


def test_stale_telemetry_shows_its_time_but_no_utilisation():
    d = doc([NodeRow("n1", "h", "Ready")], gpus("n1", 1), [], [reading("n1", 0, 50.0, age_s=600)])
    gpu = only_gpu(d)
    assert (gpu["utilization_pct"], gpu["memory_used_mib"]) == (None, None)
    assert gpu["telemetry_at"] == (T0 - timedelta(seconds=600)).isoformat()


def test_shares_and_mig_instances_count_as_their_share_and_list_every_allocation():
    rows = [AllocationRow("n1", 0, "s1", "a", 250, 10_000), AllocationRow("n1", 0, "s2", "b", 500, 20_000),
            mig_instance("n1", 1, "m1", 0), mig_instance("n1", 1, "m2", 4, "1g.10gb", 1, tenant="c")]
    d = doc([NodeRow("n1", "h", "Ready")], gpus("n1", 1) + [GpuRow("n1", 1, H100, H100_MIB, True, True)], rows)
    share, mig = d["nodes"][0]["gpus"]
    assert share["allocated_milli"] == 750 and [a["job_id"] for a in share["allocations"]] == ["s1", "s2"]
    assert mig["allocated_milli"] == 625 and mig["mig_enabled"]
    assert mig["allocations"][0] == {"job_id": "m1", "tenant": "a", "milli": 500, "memory_mib": 40_192,
                                     "mig_profile": "3g.40gb", "mig_start": 0, "mig_slices": 4}
    assert d["tenants"] == ["a", "b", "c"]
    [model] = d["models"]
    assert (model["gpus"], model["allocated"], model["free"], model["allocated_gpus"]) == (2, 2, 0, 1.375)


def test_fits_pack_whole_gpus_per_node_and_count_only_ready_nodes():
    nodes = [NodeRow("n1", "h", "Ready"), NodeRow("n2", "h", "Ready"), NodeRow("n3", "h", "Cordoned")]
    rows = gpus("n1", 8) + gpus("n2", 8) + gpus("n3", 8)
    allocations = [whole("n2", i, "j") for i in range(3)] + [AllocationRow("n2", 3, "s", "a", 100, 0)]
    d = doc(nodes, rows, allocations)
    assert {f["shape"]: f["count"] for f in d["fits"]} == {"1 GPU": 12, "2 GPUs": 6, "4 GPUs": 3, "8 GPUs": 1,
                                                           "3g.40gb": 0}
    # n1: 8 free, nothing stranded; n2: 4 entirely free + 0.9 of a share -> stranded by 8-GPU requests (4.9 / 4)
    # and by every size (0.9): 4.9/4 + 3 * 0.9/4 = 1.9
    frag = d["fragmentation"]
    assert (frag["free_gpus"], frag["stranded_gpus"]) == (12.9, 1.9)
    assert frag["figure"] == round(1.9 / 12.9, 4) and "1, 2, 4 or 8 whole GPUs" in frag["explain"]


def test_mig_fits_count_free_3g_placements_on_mig_gpus_of_an_80gb_family():
    nodes = [NodeRow("n1", "h", "Ready")]
    rows = [GpuRow("n1", 0, H100, H100_MIB, True, True), GpuRow("n1", 1, H100, H100_MIB, True, True),
            GpuRow("n1", 2, "A100-40GB", 40_960, True, True), GpuRow("n1", 3, H100, H100_MIB, False, True)]
    allocations = [mig_instance("n1", 1, "m1", 2, "1g.20gb", 2)]  # slices 2-3: blocks the 3g at 0, not at 4
    d = doc(nodes, rows, allocations)
    assert {f["shape"]: f["count"] for f in d["fits"]}["3g.40gb"] == 3  # 2 on GPU 0, 1 on GPU 1
    assert {f["shape"]: f["count"] for f in d["fits"]}["1 GPU"] == 0  # MIG GPUs take no whole-GPU job


def test_mig_fits_of_one_gpu_follow_the_placement_table():
    three = MIG_FAMILIES["H100-80GB"]["3g.40gb"]
    assert [mig_fits(three, mask) for mask in (0b0, 0b1, 0b10000, 0b10001, 0xFF)] == [2, 1, 1, 0, 0]


def test_models_total_gpus_nodes_and_mean_utilisation_over_fresh_readings():
    nodes = [NodeRow("n1", "h", "Ready"), NodeRow("n2", "h", "Ready")]
    rows = gpus("n1", 2) + gpus("n2", 1, "A100-80GB", healthy=False)
    telemetry = [reading("n1", 0, 40.0), reading("n1", 1, 60.0), reading("n2", 0, 10.0, age_s=999)]
    models = {m["model"]: m for m in doc(nodes, rows, [], telemetry)["models"]}
    assert models[H100] | {} == {"model": H100, "nodes": 1, "gpus": 2, "free": 2, "allocated": 0, "unhealthy": 0,
                                 "allocated_gpus": 0.0, "mean_utilization_pct": 50.0}
    assert (models["A100-80GB"]["unhealthy"], models["A100-80GB"]["mean_utilization_pct"]) == (1, None)


def _cluster(n: int) -> tuple:
    nodes = [NodeRow(f"n{i:04d}", "h", "Ready") for i in range(n)]
    rows = [g for i in range(n) for g in gpus(f"n{i:04d}", 8, mig=i % 10 == 0)]
    allocations = [whole(f"n{i:04d}", j, f"j{i}-{j}", f"t{i % 7}") for i in range(n) if i % 10 for j in range(i % 8)]
    return nodes, rows, allocations, [reading(g.node_id, g.index, 50.0) for g in rows]


def _fastest(cluster: tuple, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        doc(*cluster)
        times.append(time.perf_counter() - started)
    return min(times)


def test_the_cluster_view_grows_linearly_with_the_nodes():
    # a ratio measured in one run, not a wall time: 10x the nodes may cost at most 25x (quadratic would be 100x)
    small, large = _cluster(100), _cluster(1000)
    d = doc(*large)
    assert len(d["nodes"]) == 1000 and sum(len(n["gpus"]) for n in d["nodes"]) == 8000
    assert _fastest(large) < 25 * _fastest(small)


# --- properties ---------------------------------------------------------------------------------------------

NODE = st.tuples(st.sampled_from(["Ready", "Ready", "Cordoned", "Lost"]), st.integers(0, 8),
                 st.lists(st.sampled_from([0, 0, 100, 500, 1000]), min_size=8, max_size=8),
                 st.lists(st.booleans(), min_size=8, max_size=8))


@settings(max_examples=200, deadline=None)
@given(st.lists(NODE, min_size=1, max_size=12))
def test_fits_never_exceed_free_capacity_and_fragmentation_stays_between_0_and_1(spec):
    nodes, rows, allocations = [], [], []
    for i, (state, n, milli, healthy) in enumerate(spec):
        nodes.append(NodeRow(f"n{i}", "h", state))
        for j in range(n):
            rows.append(GpuRow(f"n{i}", j, H100, H100_MIB, healthy[j], False))
            if milli[j]:
                allocations.append(AllocationRow(f"n{i}", j, f"j{i}-{j}", "a", milli[j], 0))
    d = doc(nodes, rows, allocations)
    free_whole = sum(1 for n in d["nodes"] if n["state"] == "Ready" for g in n["gpus"] if g["state"] == "free")
    for fit in d["fits"]:
        if "gpus" in fit:
            assert fit["count"] * fit["gpus"] <= free_whole
    frag = d["fragmentation"]
    assert 0.0 <= frag["figure"] <= 1.0 and frag["stranded_gpus"] <= frag["free_gpus"] + 1e-9
    assert sum(m["gpus"] for m in d["models"]) == len(rows)


# --- usage samples (the metrics service's cycle) -----------------------------------------------------------------

def test_usage_samples_count_shares_busy_gpus_and_a_share_weighted_mean():
    shares = [ShareRow("n1", 0, "j1", "a", 1000), ShareRow("n1", 1, "j2", "a", 500), ShareRow("n1", 2, "j3", "b", 1000),
              ShareRow("n1", 3, "orphan", None, 1000), ShareRow("gone", 0, "j4", "a", 1000)]
    models = {("n1", i): H100 for i in range(4)}
    activity = {("n1", 0): GpuReading("n1", 0, 90.0, T0), ("n1", 1): GpuReading("n1", 1, 30.0, T0),
                ("n1", 2): GpuReading("n1", 2, 99.0, T0 - timedelta(minutes=5))}  # b's reading is stale
    a, b = plan_usage_samples(shares, models, activity, T0, busy_pct=5.0, max_sample_age=timedelta(seconds=30))
    assert (a.tenant, a.gpu_model, a.allocated_gpus, a.busy_gpus) == ("a", H100, 1.5, 1.5)
    assert a.mean_utilization_pct == round((90.0 + 0.5 * 30.0) / 1.5, 4)
    assert (b.tenant, b.allocated_gpus, b.busy_gpus, b.mean_utilization_pct) == ("b", 1.0, 0.0, None)
