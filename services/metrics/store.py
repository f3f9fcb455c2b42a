"""All of the metrics service's SQL: read the cluster snapshot (inventory and allocations through placement's
store functions, the queue from the jobs read model, quota through quota's), keep the scaler's state, and
record scale decisions with their outbox rows in one transaction; on each sampling cycle, the latest reading of
every GPU (``gpu_telemetry``) and what each tenant held and used (``usage_samples``), for the dashboard."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from itertools import chain, repeat
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev
from gpusched_common.store import enqueue
from gpusched_common.stores import cluster, dashboard, quota
from gpusched_common.topics import CLUSTER_SCALING

from gpusched_core.dashboard import ShareRow, UsageSample
from gpusched_core.metrics.scaling import Decision, InFlight, ModelState, ScalerState
from gpusched_core.metrics.views import BacklogJob, ClusterSnapshot, GpuReading, GpuSlot, GroupView, TenantQuota
from gpusched_core.placement.cycle import charged_model
from gpusched_core.quota import units_to_gpus

SERVICE = "metrics"
_SCALER_LOCK = 727_300  # one metrics replica decides scaling at a time


async def load_snapshot(conn: asyncpg.Connection, pool_label: str) -> ClusterSnapshot:
    """The cluster (placement's), the jobs waiting or running (the jobs read model) with the model each
    runs on, and the tenants' quota (quota's), read through their owners' store functions."""
    gpus = await cluster.gpu_slots(conn, pool_label)
    running = await conn.fetch("SELECT job_id, tenant FROM jobs WHERE status IN ('Placed', 'Running')")
    # the waiting jobs counted in the store, by shape (tens of thousands waiting are a handful of rows here);
    # a job that names no model runs on the one its quota was charged for, also when it is requeued
    shapes = [(BacklogJob(s.tenant, s.gpus, charged_model(s.gpu_model, s.flavor), quota_reserved=s.reserved), s.jobs)
              for s in await quota.waiting_shapes(conn)]
    return ClusterSnapshot(
        gpus=tuple(GpuSlot(g.node_id, g.gpu_index, g.model, g.pool or "default", g.healthy, g.job_id,
                           g.allocated_at) for g in gpus),
        pending=tuple(chain.from_iterable(repeat(job, count) for job, count in shapes)),
        quotas=tuple(TenantQuota(q.tenant, units_to_gpus(q.nominal_units), units_to_gpus(q.reserved_units))
                     for q in await quota.tenant_totals(conn)),
        job_tenants={r["job_id"]: r["tenant"] for r in running},
    )


async def record_utilization(conn: asyncpg.Connection, at: datetime, cluster: GroupView, *,
                             keep_s: float | None = None) -> None:
    """One utilization sample; samples older than ``keep_s`` are deleted (a day at a time per call, so a
    long backlog is worked off without one long lock)."""
    await conn.execute(
        "INSERT INTO cluster_utilization (sampled_at, gpus_reporting, gpus_busy, mean_utilization)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
        at, cluster.gpus_reporting, cluster.gpus_busy, cluster.mean_utilization)
    if keep_s is not None:
        await conn.execute(
            "DELETE FROM cluster_utilization WHERE sampled_at IN (SELECT sampled_at FROM cluster_utilization"
            " WHERE sampled_at < $1 ORDER BY sampled_at LIMIT 10000)", at - timedelta(seconds=keep_s))


async def record_telemetry(conn: asyncpg.Connection, readings: Iterable[GpuReading]) -> None:
    """The latest reading of each GPU into ``gpu_telemetry``, in one multi-row upsert; a reading older than
    the row's (another replica's, or one delivered late) leaves the row as it is."""
    rows = sorted(readings, key=lambda r: (r.node_id, r.index))  # one order: two replicas never deadlock
    if not rows:
        return
    await conn.execute(
        "INSERT INTO gpu_telemetry AS t (node_id, gpu_index, utilization_pct, memory_used_mib, healthy, sampled_at)"
        " SELECT * FROM unnest($1::text[], $2::int[], $3::float8[], $4::bigint[], $5::bool[], $6::timestamptz[])"
        " ON CONFLICT (node_id, gpu_index) DO UPDATE SET utilization_pct = EXCLUDED.utilization_pct,"
        " memory_used_mib = EXCLUDED.memory_used_mib, healthy = EXCLUDED.healthy, sampled_at = EXCLUDED.sampled_at"
        " WHERE t.sampled_at <= EXCLUDED.sampled_at",
        [r.node_id for r in rows], [r.index for r in rows], [r.utilization_pct for r in rows],
        [r.memory_used_mib for r in rows], [r.healthy for r in rows], [r.sampled_at for r in rows])


async def load_shares(conn: asyncpg.Connection) -> list[ShareRow]:
    """Every allocation with its milli and its job's tenant (placement's table, through its store)."""
    return await dashboard.allocation_shares(conn)


async def record_usage(conn: asyncpg.Connection, at: datetime, samples: Iterable[UsageSample], *,
                       keep_s: float | None = None) -> None:
    """The cycle's ``usage_samples`` rows (one statement); rows older than ``keep_s`` are deleted, a bounded
    number per call, as ``record_utilization`` does."""
    rows = list(samples)
    if rows:
        await conn.execute(
            "INSERT INTO usage_samples (sampled_at, tenant, gpu_model, allocated_gpus, busy_gpus, mean_utilization_pct)"
            " SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::float8[], $5::float8[], $6::float8[])"
            " ON CONFLICT DO NOTHING",
            [s.sampled_at for s in rows], [s.tenant for s in rows], [s.gpu_model for s in rows],
            [s.allocated_gpus for s in rows], [s.busy_gpus for s in rows], [s.mean_utilization_pct for s in rows])
    if keep_s is not None:
        await conn.execute(
            "DELETE FROM usage_samples WHERE (sampled_at, tenant, gpu_model) IN (SELECT sampled_at, tenant, gpu_model"
            " FROM usage_samples WHERE sampled_at < $1 ORDER BY sampled_at LIMIT 50000)", at - timedelta(seconds=keep_s))


# --- scaler state ---------------------------------------------------------------------------------------


def _dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def dump_state(state: ScalerState) -> dict:
    return {
        "models": {m: {"pressure_since": _iso(s.pressure_since), "last_high_at": _iso(s.last_high_at),
                       "last_out_at": _iso(s.last_out_at), "last_in_at": _iso(s.last_in_at),
                       "in_flight": [{"nodes": f.nodes, "requested_at": f.requested_at.isoformat(),
                                      "baseline_nodes": f.baseline_nodes} for f in s.in_flight]}
                   for m, s in state.models.items()},
        "empty_since": {n: t.isoformat() for n, t in state.empty_since.items()},
        "requested_in": sorted(state.requested_in),
    }


def load_state(doc: dict | None) -> ScalerState:
    if not doc:
        return ScalerState()
    models = {m: ModelState(_dt(s["pressure_since"]), _dt(s["last_high_at"]), _dt(s["last_out_at"]),
                            _dt(s["last_in_at"]),
                            tuple(InFlight(f["nodes"], datetime.fromisoformat(f["requested_at"]), f["baseline_nodes"])
                                  for f in s["in_flight"]))
              for m, s in doc.get("models", {}).items()}
    return ScalerState(models, {n: datetime.fromisoformat(t) for n, t in doc.get("empty_since", {}).items()},
                       frozenset(doc.get("requested_in", [])))


async def decide_scaling(pool: asyncpg.Pool, plan, now: datetime) -> tuple[Decision, ...]:
    """Load the scaler state, call `plan(state) -> (state, decisions)`, and store state, decisions and their
    outbox rows in one transaction (so a crash neither loses nor repeats a decision)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCALER_LOCK)
        doc = await conn.fetchval("SELECT state FROM metrics_scaler_state WHERE id = 1")
        state, decisions = plan(load_state(doc))
        await conn.execute(
            "INSERT INTO metrics_scaler_state (id, state, updated_at) VALUES (1, $1, $2)"
            " ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, updated_at = EXCLUDED.updated_at",
            dump_state(state), now)
        for decision in decisions:
            event_id = str(uuid.uuid4())
            out = isinstance(decision, ev.ScaleOutRequested)
            await conn.execute(
                "INSERT INTO scale_decisions (event_id, decided_at, direction, gpu_model, node_id, nodes, reason,"
                " evidence) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                event_id, now, "out" if out else "in", decision.gpu_model, None if out else decision.node_id,
                decision.nodes if out else 1, decision.reason,
                decision.model_dump(mode="json"))
            envelope = ev.make_envelope(decision, event_id=event_id, stream_id=f"scaling-{decision.gpu_model}",
                                        occurred_at=now, producer=SERVICE)
            await enqueue(conn, producer=SERVICE, topic=CLUSTER_SCALING.name, key=decision.gpu_model, envelopes=[envelope])
    return decisions
