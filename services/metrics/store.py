"""The metrics service's PostgreSQL edge: read the cluster snapshot (inventory and allocations owned by
placement, the queue from the jobs read model, quota from the quota service's usage rows), keep the scaler's state, and
record scale decisions with their outbox rows in one transaction."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.store import enqueue
from gpusched_common.topics import CLUSTER_SCALING

from services.metrics.core import ClusterSnapshot, GpuSlot, PendingJob, TenantQuota
from services.metrics.scaling import Decision, InFlight, ModelState, ScaleOut, ScalerState
from gpusched_core.quota import units_to_gpus

SERVICE = "metrics"
_SCALER_LOCK = 727_300  # one metrics replica decides scaling at a time


async def load_snapshot(conn: asyncpg.Connection, pool_label: str) -> ClusterSnapshot:
    # one slot per GPU: a GPU shared by several jobs (shares, MIG slices) shows its earliest allocation
    gpus = await conn.fetch(
        "SELECT DISTINCT ON (g.node_id, g.gpu_index) g.node_id, g.gpu_index, g.model, g.healthy,"
        " n.labels ->> $1 AS pool, a.job_id, a.allocated_at"
        " FROM gpus g JOIN nodes n USING (node_id) LEFT JOIN gpu_allocations a USING (node_id, gpu_index)"
        " ORDER BY g.node_id, g.gpu_index, a.allocated_at, a.job_id", pool_label)
    # a job that names no model runs on the one its quota was charged for, also when it is requeued
    jobs = await conn.fetch(
        "SELECT j.job_id, j.tenant, j.status, j.gpus, coalesce(j.gpu_model, r.flavor) AS gpu_model FROM jobs j"
        " LEFT JOIN quota_policy_reservations r USING (job_id)"
        " WHERE j.status IN ('Admitted', 'Queued', 'Placed', 'Running')")
    quotas = await conn.fetch(
        "SELECT tenant, sum(nominal_units) AS nominal, sum(reserved_units) AS reserved FROM quota_policy_usage"
        " GROUP BY tenant ORDER BY tenant")
    return ClusterSnapshot(
        gpus=tuple(GpuSlot(r["node_id"], r["gpu_index"], r["model"], r["pool"] or "default", r["healthy"],
                           r["job_id"], r["allocated_at"]) for r in gpus),
        pending=tuple(PendingJob(r["job_id"], r["tenant"] or "", r["gpus"] or 0, r["gpu_model"],
                                 quota_reserved=r["status"] == "Queued")
                      for r in jobs if r["status"] in ("Admitted", "Queued")),
        quotas=tuple(TenantQuota(r["tenant"], units_to_gpus(r["nominal"]), units_to_gpus(r["reserved"]))
                     for r in quotas),
        job_tenants={r["job_id"]: r["tenant"] for r in jobs if r["status"] in ("Placed", "Running")},
    )


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


def to_payload(decision: Decision, now: datetime) -> ev.Payload:
    if isinstance(decision, ScaleOut):
        return ev.ScaleOutRequested(
            gpu_model=decision.model, nodes=decision.nodes, reason=decision.reason,
            pending_gpus=decision.pending_gpus, unplaceable_gpus=decision.unplaceable_gpus,
            free_gpus=decision.free_gpus, gpus_per_node=decision.gpus_per_node,
            in_flight_nodes=decision.in_flight_nodes, pressure_since=decision.pressure_since, decided_at=now)
    return ev.ScaleInRequested(
        node_id=decision.node_id, gpu_model=decision.model, reason=decision.reason, empty_since=decision.empty_since,
        idle_s=decision.idle_s, nodes_of_model=decision.nodes_of_model, pending_gpus=decision.pending_gpus,
        decided_at=now, pool=decision.pool)


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
            payload = to_payload(decision, now)
            event_id = str(uuid.uuid4())
            out = isinstance(decision, ScaleOut)
            await conn.execute(
                "INSERT INTO scale_decisions (event_id, decided_at, direction, gpu_model, node_id, nodes, reason,"
                " evidence) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                event_id, now, "out" if out else "in", decision.model, None if out else decision.node_id,
                decision.nodes if isinstance(decision, ScaleOut) else 1, decision.reason,
                json.loads(json.dumps(asdict(decision), default=str)))
            envelope = ev.make_envelope(payload, event_id=event_id, stream_id=f"scaling-{decision.model}",
                                        occurred_at=now, producer=SERVICE)
            await enqueue(conn, producer=SERVICE, topic=CLUSTER_SCALING.name, key=decision.model, envelopes=[envelope])
    return decisions
