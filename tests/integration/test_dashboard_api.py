"""The dashboard's data routes on real PostgreSQL, driving the real gateway app (issue 17): a metrics sampling
cycle writes gpu_telemetry and usage_samples; GET /v1/cluster shows nodes, GPU states, allocations, fits and
fragmentation (operators and viewers only); GET /v1/history buckets usage, waits and preemptions, narrowed to
a user's tenant; GET /v1/tenants adds cohorts, fair shares and decayed usage; GET /v1/queue gives each waiting
job its shape and what blocks it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpusched_common import events as ev
from gpusched_common.db import connect, create_pool
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.quota import load_tenancy
from gpusched_core.quota.jobs import QueuedJob
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.metrics.handlers import MetricsService
from services.metrics.settings import MetricsSettings
from services.placement.handlers import process
from services.placement.store import queue_for_placement
from services.quota import store as quota_store
from tests.builders import a_job
from tests.integration.test_gateway_api import assert_problem, bearer, issue

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(autouse=True)
def _now_is_when_the_test_runs() -> None:
    """``NOW`` is set again as each test starts: the gateway reads the real clock, and a time taken at
    import is stale by the time a long suite reaches this module."""
    global NOW
    NOW = datetime.now(UTC).replace(microsecond=0)
H100 = "H100-80GB"
TENANCY = """
version: 1
revision: 3
flavors: [H100-80GB]
tenants:
  - name: org
    children:
      - name: a
        weight: 2
        quota: {H100-80GB: {nominal: 4}}
      - name: b
        quota: {H100-80GB: {nominal: 4}}
"""


async def register(conn, node_id: str, gpus: int) -> None:
    await process(conn, ev.NodeRegistered(
        node_id=node_id, hostname=f"host-{node_id}", cpu_milli=64_000, memory_mib=524_288, nvml_backend="simulated",
        lease_epoch=1, gpus=[ev.GpuInventory(index=i, uuid=f"{node_id}-{i}", model=H100, memory_mib=81559)
                             for i in range(gpus)]), NOW, engine.make_policy("bestfit"))


async def job_row(conn, job_id: str, tenant: str, status: str, *, submitted: datetime | None = None,
                  placed: datetime | None = None) -> None:
    await conn.execute("INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, submitted_at, placed_at,"
                       " updated_at) VALUES ($1, $2, $3, 3, 1, $4, $5, $6, now())",
                       job_id, tenant, status, H100, submitted, placed)


async def allocate(conn, node: str, index: int, job: str, milli: int = 1000, memory_mib: int = 0,
                   mig: tuple[str, int, int] | None = None) -> None:
    profile, start, slices = mig or (None, None, None)
    await conn.execute("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, milli, memory_mib,"
                       " mig_profile, mig_start, mig_memory_slices) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                       node, index, job, NOW, milli, memory_mib, profile, start, slices)


async def preempted(conn, job_id: str, tenant: str, at: datetime) -> None:
    await conn.execute("INSERT INTO events (stream_id, version, event_id, type, schema_version, occurred_at, producer,"
                       " tenant, payload) VALUES ($1, 1, $2, 'JobPreempted', 1, $3, 'test', $4, '{}'::jsonb)",
                       f"job-{job_id}", uuid.uuid4(), at, tenant)


async def seed(conn) -> None:
    """n1: 8 H100s (a holds GPUs 0-1, b a 250-milli share of GPU 2); n2: cordoned, 2 idle H100s; n3: 2 H100s in
    MIG mode, a 3g.40gb of a's at slice 0 of GPU 0. Jobs placed in the last day and two preemptions."""
    for node, gpus in (("n1", 8), ("n2", 2), ("n3", 2)):
        await register(conn, node, gpus)
    await conn.execute("UPDATE nodes SET cordoned_at = $1, cordoned_by = 'test' WHERE node_id = 'n2'", NOW)
    await conn.execute("UPDATE gpus SET mig_enabled = true WHERE node_id = 'n3'")
    await conn.execute("UPDATE gpus SET healthy = false WHERE node_id = 'n1' AND gpu_index = 7")
    for job, tenant in (("run-a", "a"), ("share-b", "b"), ("mig-a", "a")):
        await job_row(conn, job, tenant, "Running", submitted=NOW - timedelta(hours=2), placed=NOW - timedelta(hours=1))
    for i, wait_s in enumerate((5, 50, 500)):
        await job_row(conn, f"done-a-{i}", "a", "Succeeded", submitted=NOW - timedelta(hours=3, seconds=wait_s),
                      placed=NOW - timedelta(hours=3))
    await job_row(conn, "done-b", "b", "Succeeded", submitted=NOW - timedelta(hours=5), placed=NOW - timedelta(hours=4))
    await allocate(conn, "n1", 0, "run-a")
    await allocate(conn, "n1", 1, "run-a")
    await allocate(conn, "n1", 2, "share-b", 250, 8192)
    await allocate(conn, "n3", 0, "mig-a", 500, 40192, ("3g.40gb", 0, 4))
    await preempted(conn, "run-a", "a", NOW - timedelta(minutes=50))
    await preempted(conn, "share-b", "b", NOW - timedelta(minutes=40))


def telemetry(node: str, pct: dict[int, float], at: datetime) -> ev.GpuTelemetry:
    return ev.GpuTelemetry(node_id=node, sampled_at=at, samples=[
        ev.GpuSample(index=i, uuid=f"{node}-{i}", utilization_pct=u, memory_used_mib=1000 + i, memory_total_mib=81559,
                     power_w=100, temperature_c=40, sm_clock_mhz=1500) for i, u in pct.items()])


async def sample(database_url: str) -> None:
    """Two sampling cycles of the real metrics service, a minute apart (its clock given)."""
    clock = iter([NOW - timedelta(seconds=70), NOW - timedelta(seconds=10)])
    service = MetricsService(MetricsSettings(database_url=database_url), clock=lambda: next(clock))
    pool = await create_pool(database_url)
    try:
        for at, busy in ((NOW - timedelta(seconds=70), 3.0), (NOW - timedelta(seconds=10), 90.0)):
            service.tracker.record(telemetry("n1", {0: busy, 1: 2.0, 2: 60.0, 3: 0.0}, at))
            service.tracker.record(telemetry("n3", {0: 30.0, 1: 0.0}, at))
            await service.evaluate(pool)
    finally:
        await pool.close()
        await service.close()


@pytest.fixture
async def gateway(database_url: str):
    conn = await connect(database_url)
    try:
        await seed(conn)
        names = {"operator": await issue(conn, "operator", None, now=NOW),
                 "viewer": await issue(conn, "viewer", None, now=NOW),
                 "user": await issue(conn, "user", "a", now=NOW),
                 "tenant-admin": await issue(conn, "tenant-admin", "a", now=NOW)}
    finally:
        await conn.close()
    await sample(database_url)
    app = create_app(GatewaySettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, names, database_url


async def get(client, names, role: str, path: str, **params) -> dict:
    response = await client.get(path, headers=bearer(names[role]), params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_sampling_cycle_writes_each_gpu_s_latest_reading_and_each_tenant_s_usage(gateway):
    _, _, database_url = gateway
    conn = await connect(database_url)
    try:
        latest = {(r["node_id"], r["gpu_index"]): r for r in await conn.fetch("SELECT * FROM gpu_telemetry")}
        usage = [tuple(r) for r in await conn.fetch(
            "SELECT sampled_at, tenant, gpu_model, allocated_gpus, busy_gpus, mean_utilization_pct FROM usage_samples"
            " ORDER BY 1, 2")]
    finally:
        await conn.close()
    assert len(latest) == 6 and latest[("n1", 0)]["utilization_pct"] == 90.0
    assert latest[("n1", 0)]["sampled_at"] == NOW - timedelta(seconds=10) and latest[("n1", 3)]["memory_used_mib"] == 1003
    first, second = NOW - timedelta(seconds=70), NOW - timedelta(seconds=10)
    # a: GPUs 0 and 1 of n1 (one busy in the second cycle only) and half of n3's GPU 0 (busy at 30%); b: a quarter
    assert usage == [(first, "a", H100, 2.5, 0.5, round((3.0 + 2.0 + 0.5 * 30.0) / 2.5, 4)),
                     (first, "b", H100, 0.25, 0.25, 60.0),
                     (second, "a", H100, 2.5, 1.5, round((90.0 + 2.0 + 0.5 * 30.0) / 2.5, 4)),
                     (second, "b", H100, 0.25, 0.25, 60.0)]


async def test_the_cluster_shows_gpu_states_allocations_fits_and_fragmentation(gateway):
    client, names, _ = gateway
    doc = await get(client, names, "viewer", "/v1/cluster")
    assert doc == await get(client, names, "operator", "/v1/cluster") | {"as_of": doc["as_of"]}
    nodes = {n["node_id"]: n for n in doc["nodes"]}
    assert {n: v["state"] for n, v in nodes.items()} == {"n1": "Ready", "n2": "Cordoned", "n3": "Ready"}
    states = {(n, g["index"]): g["state"] for n, v in nodes.items() for g in v["gpus"]}
    assert [states["n1", i] for i in range(8)] == ["busy", "idle", "busy"] + ["free"] * 4 + ["unhealthy"]
    assert (states["n2", 0], states["n3", 0], states["n3", 1]) == ("cordoned", "busy", "free")
    share = nodes["n1"]["gpus"][2]
    assert share["allocated_milli"] == 250 and share["utilization_pct"] == 60.0 and share["memory_used_mib"] == 1002
    assert share["allocations"] == [{"job_id": "share-b", "tenant": "b", "milli": 250, "memory_mib": 8192,
                                     "mig_profile": None, "mig_start": None, "mig_slices": None}]
    assert nodes["n3"]["gpus"][0]["allocations"][0]["mig_profile"] == "3g.40gb"
    # free whole GPUs on Ready nodes: n1's 3-6 (n2 is cordoned; n3's are in MIG mode); 3g.40gb: 1 + 2 on n3
    assert {f["shape"]: f["count"] for f in doc["fits"]} == {"1 GPU": 4, "2 GPUs": 2, "4 GPUs": 1, "8 GPUs": 0,
                                                             "3g.40gb": 3}
    frag = doc["fragmentation"]
    # n1's 4.75 free GPUs: the share's 0.75 is stranded for every size, and all of it for 8 GPUs: (3 * 0.75 + 4.75) / 4
    assert (frag["free_gpus"], frag["stranded_gpus"], frag["figure"]) == (4.75, 1.75, round(1.75 / 4.75, 4))
    assert doc["tenants"] == ["a", "b"]
    [model] = doc["models"]
    assert (model["nodes"], model["gpus"], model["free"], model["allocated"], model["unhealthy"]) == (3, 12, 5, 4, 1)


@pytest.mark.parametrize("role", ["user", "tenant-admin"])
async def test_a_tenant_s_principal_may_not_read_the_cluster(gateway, role):
    client, names, _ = gateway
    assert "role" in assert_problem(await client.get("/v1/cluster", headers=bearer(names[role])), 403)["detail"]


async def test_history_buckets_usage_waits_and_preemptions_and_a_user_sees_only_its_tenant(gateway):
    client, names, _ = gateway
    since = (NOW - timedelta(hours=6)).isoformat()
    everyone = await get(client, names, "viewer", "/v1/history", since=since, until=NOW.isoformat(), step_s=3600)
    assert (everyone["tenant"], everyone["step_s"], everyone["buckets"]) == (None, 3600, 6)
    assert {s["tenant"] for s in everyone["series"]} == {"a", "b"}
    [last] = next(s for s in everyone["series"] if s["tenant"] == "a")["points"]
    assert last[1:3] == [2.5, 1.0]  # the mean of the two cycles in the last bucket
    waits = {w["tenant"]: w for w in everyone["waits"]}
    # a's waits: 5, 50 and 500 s placed 3 hours ago, 3600 s twice an hour ago (nearest rank: p50 is the 3rd)
    assert (waits["a"]["count"], waits["a"]["p50_s"], waits["a"]["p99_s"]) == (5, 500.0, 3600.0)
    assert [h["count"] for h in waits["a"]["histogram"]] == [0, 1, 1, 0, 1, 2, 0]
    assert {p["tenant"]: sum(n for _, n in p["points"]) for p in everyone["preemptions"]} == {"a": 1, "b": 1}
    mine = await get(client, names, "user", "/v1/history", since=since, until=NOW.isoformat(), step_s=3600)
    assert mine["tenant"] == "a" and {s["tenant"] for s in mine["series"]} == {"a"}
    assert [w["tenant"] for w in mine["waits"]] == ["a"] and [p["tenant"] for p in mine["preemptions"]] == ["a"]
    assert_problem(await client.get("/v1/history", headers=bearer(names["user"]), params={"tenant": "b"}), 403)


@pytest.mark.parametrize(("params", "said"), [
    ({"since": NOW.isoformat(), "until": (NOW - timedelta(hours=1)).isoformat()}, "later than"),
    ({"since": "2026-01-01T00:00:00"}, "time zone"),
    ({"step_s": "1"}, "at most 2000")])
async def test_a_history_window_that_cannot_be_answered_is_a_400_problem(gateway, params, said):
    client, names, _ = gateway
    assert said in assert_problem(await client.get("/v1/history", headers=bearer(names["viewer"]), params=params),
                                  400)["detail"]


async def waiting(conn, job_id: str, builder) -> ev.JobSpec:
    spec = builder.spec()
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, NOW), NOW),
                            producer="test", now=NOW)
    return spec


async def test_tenants_carry_cohorts_fair_shares_decayed_usage_and_pending_work(gateway):
    client, names, database_url = gateway
    conn = await connect(database_url)
    try:
        await quota_store.install(conn, load_tenancy(TENANCY), TENANCY, source="test", event_id=None, now=NOW)
        await conn.execute("UPDATE quota_policy_usage SET reserved_units = 35000 WHERE tenant = 'a'")
        await conn.execute("INSERT INTO quota_policy_history (tenant, as_of_s, geq_s) VALUES ('a', $1, $2)",
                           NOW.timestamp(), {H100: 3600.0})
        await waiting(conn, "wait-a", a_job("wait-a").tenant("a").gpus(2).gang(2))
        await waiting(conn, "wait-new", a_job("wait-new").tenant("a").gpus(3))  # no service has handled it yet
        await quota_store.queue_job(conn, QueuedJob("wait-a", "a", 2, None, 0, NOW.timestamp(), nodes=2))
    finally:
        await conn.close()
    doc = await get(client, names, "operator", "/v1/tenants")
    assert doc["revision"] == 3 and {u["tenant"] for u in doc["usage"]} == {"a", "b"}
    tenants = {t["tenant"]: t for t in doc["tenants"]}
    a = tenants["a"]
    assert (a["cohort"], a["weight"], a["fair_share"], tenants["b"]["fair_share"]) == ("org", 2.0, 0.666667, 0.333333)
    assert a["decayed_usage"] > 0 and tenants["b"]["decayed_usage"] == 0
    assert (a["pending_jobs"], a["pending_gpus"]) == (2, 7.0)
    assert a["flavors"] == [{"flavor": H100, "reserved_units": 35000, "nominal_units": 28000, "limit_units": None,
                             "borrowed_units": 7000}]
    assert doc["cohorts"] == [{"cohort": "org", "tenants": ["a", "b"], "nominal_units": 56000, "reserved_units": 35000}]
    assert doc["units"]["per_gpu"] == 7000
    mine = await get(client, names, "user", "/v1/tenants")
    assert [t["tenant"] for t in mine["tenants"]] == ["a"] and [c["cohort"] for c in mine["cohorts"]] == ["org"]


async def test_each_waiting_job_carries_its_shape_and_what_blocks_it(gateway):
    client, names, database_url = gateway
    conn = await connect(database_url)
    try:
        spec = await waiting(conn, "q-share", a_job("q-share").tenant("a").share(250, 4096))
        await queue_for_placement(conn, "q-share", spec)
        await waiting(conn, "q-mig", a_job("q-mig").tenant("a").mig("3g.40gb").model(H100))
        await quota_store.queue_job(conn, QueuedJob("q-mig", "a", 1, H100, 0, NOW.timestamp(), mig_profile="3g.40gb"))
        await waiting(conn, "q-gang", a_job("q-gang").tenant("a").gpus(4).gang(2))
        await quota_store.queue_job(conn, QueuedJob("q-gang", "a", 4, None, 0, NOW.timestamp(), nodes=2))
        await waiting(conn, "q-new", a_job("q-new").tenant("a").gpus(3))  # no service has handled it yet
    finally:
        await conn.close()
    jobs = {j["job_id"]: j for j in (await get(client, names, "user", "/v1/queue"))["jobs"]}
    share, mig = jobs["q-share"], jobs["q-mig"]
    assert (share["blocked_by"], share["share_milli"], share["share_memory_mib"], share["nodes"], share["gpus"]) == (
        "capacity", 250, 4096, 1, 1)
    assert (mig["blocked_by"], mig["mig_profile"], mig["gpu_model"]) == ("quota", "3g.40gb", H100)
    gang = jobs["q-gang"]
    assert (gang["gpus"], gang["gpus_per_node"], gang["nodes"], gang["blocked_by"]) == (8, 4, 2, "quota")
    new = jobs["q-new"]  # admitted, in neither queue yet: it waits for quota, its shape is the jobs row's total
    assert (new["gpus"], new["gpus_per_node"], new["nodes"], new["blocked_by"], new["position"]) == (
        3, None, None, "quota", None)
    hidden = (await get(client, names, "viewer", "/v1/queue"))["jobs"]
    assert all(set(j) == {"job_id", "queue", "position"} for j in hidden)
