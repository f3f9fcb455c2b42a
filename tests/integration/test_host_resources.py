"""Host CPU and memory on real PostgreSQL: a job's cpu_milli / memory_mib are held on each of its nodes
while it holds GPUs there, a job that needs more than is left waits with the reason, what a finished job
held goes back with its GPUs, a reloaded cluster counts what running jobs hold, and PostgreSQL refuses a
node's host resources beyond its capacity whichever process writes."""

from __future__ import annotations

import json

import asyncpg
import pytest

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import placement as engine
from services.placement.handlers import process
from gpusched_common.stores.cluster import load_cluster
from tests.builders import T0, a_job

POLICY = engine.make_policy("bestfit")
CPU, MEMORY = 16_000, 65_536  # each node: 16 cores, 64 GiB, 4 GPUs


def node(node_id: str) -> ev.NodeRegistered:
    return ev.NodeRegistered(
        node_id=node_id, hostname=node_id, cpu_milli=CPU, memory_mib=MEMORY, nvml_backend="simulated", lease_epoch=1,
        gpus=[ev.GpuInventory(index=i, uuid=f"{node_id}-{i}", model="H100-80GB", memory_mib=81559) for i in range(4)])


async def reserve(conn: asyncpg.Connection, job_id: str, gpus: int, cpu_milli: int, memory_mib: int = 0,
                  nodes: int = 1, env: dict[str, str] | None = None) -> None:
    spec = a_job(job_id).gpus(gpus).gang(nodes).host(cpu_milli, memory_mib).spec()
    spec = spec.model_copy(update={"env": env or {}})
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0), T0),
                                    producer="test", now=T0)
    events = lifecycle.decide(state, lifecycle.ReserveQuota(gpus * nodes, 64), T0)
    await append_job_events(conn, state, events, producer="test", now=T0)
    await process(conn, events[0], T0, POLICY)


async def last_event(conn: asyncpg.Connection, job_id: str) -> dict:
    row = await conn.fetchrow("SELECT type, payload FROM events WHERE stream_id = $1 ORDER BY version DESC LIMIT 1",
                              f"job-{job_id}")
    return {"type": row["type"], **row["payload"]}


async def start_env(conn: asyncpg.Connection, job_id: str) -> dict[str, str]:
    """The environment the job's StartJob gives it (from placement's outbox)."""
    for row in await conn.fetch("SELECT value FROM outbox WHERE topic = 'gpusched.nodes.commands' ORDER BY id"):
        message = json.loads(bytes(row["value"]))
        if message["type"] == "StartJob" and message["payload"]["job_id"] == job_id:
            return message["payload"]["env"]
    raise AssertionError(f"no StartJob for {job_id}")


async def host_usage(conn: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    return {r["node_id"]: (r["cpu_milli"], r["memory_mib"])
            for r in await conn.fetch("SELECT node_id, cpu_milli, memory_mib FROM host_usage ORDER BY node_id")}


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    async with connection.transaction():
        await process(connection, node("n1"), T0, POLICY)
    yield connection
    await connection.close()


async def test_a_job_waits_for_host_cpu_while_gpus_are_free_and_runs_when_it_comes_back(conn):
    async with conn.transaction():
        await reserve(conn, "big", 1, 12_000, 32_768)
        await reserve(conn, "next", 1, 8_000, env={"OMP_NUM_THREADS": "4"})
    assert (await last_event(conn, "big"))["type"] == "JobPlaced"
    assert await start_env(conn, "big") == {
        "GPUSCHED_CPU_MILLI": "12000", "OMP_NUM_THREADS": "12", "GPUSCHED_MEMORY_MIB": "32768"}
    deferred = await last_event(conn, "next")
    assert deferred["type"] == "PlacementDeferred"  # 3 GPUs are free, 4 cores are not enough
    assert any("less than 8000 CPU milli free" in r for r in deferred["reasons"]), deferred["reasons"]
    assert await host_usage(conn) == {"n1": (12_000, 32_768)}

    _, snapshot = await load_cluster(conn)  # a placer that loads the cluster afresh counts what runs
    row = snapshot.node_index(engine.NodeId("n1"))
    assert (snapshot.cpu_free[row], snapshot.memory_free[row]) == (CPU - 12_000, MEMORY - 32_768)

    async with conn.transaction():
        await process(conn, ev.JobExitReported(job_id="big", node_id="n1", exit_code=0, runtime_s=5.0), T0, POLICY)
    assert (await last_event(conn, "next"))["type"] == "JobPlaced"
    assert await host_usage(conn) == {"n1": (8_000, 0)}
    assert (await start_env(conn, "next"))["OMP_NUM_THREADS"] == "4"  # the job's own setting stands


async def test_a_gang_holds_host_resources_on_every_node_once(conn):
    async with conn.transaction():
        await process(conn, node("n2"), T0, POLICY)
        await reserve(conn, "gang", 4, 10_000, 1_024, nodes=2)
    assert (await last_event(conn, "gang"))["type"] == "JobPlaced"
    assert await host_usage(conn) == {"n1": (10_000, 1_024), "n2": (10_000, 1_024)}
    rows = await conn.fetch("SELECT node_id, gpu_index, host_cpu_milli FROM gpu_allocations WHERE host_cpu_milli > 0"
                            " ORDER BY node_id")
    assert [(r["node_id"], r["gpu_index"]) for r in rows] == [("n1", 0), ("n2", 0)]  # on the first GPU of each


async def test_postgresql_refuses_host_resources_beyond_the_node(conn):
    insert = ("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, host_cpu_milli, host_memory_mib)"
              " VALUES ('n1', $1, $2, $3, $4, $5)")
    await conn.execute(insert, 0, "a", T0, 10_000, 0)
    with pytest.raises(asyncpg.CheckViolationError, match="host_usage_cpu_within_node"):
        await conn.execute(insert, 1, "b", T0, 6_001, 0)
    with pytest.raises(asyncpg.CheckViolationError, match="host_usage_memory_within_node"):
        await conn.execute(insert, 1, "c", T0, 0, MEMORY + 1)
    await conn.execute(insert, 1, "d", T0, 6_000, MEMORY)  # exactly what is left
    await conn.execute("DELETE FROM gpu_allocations WHERE job_id = 'a'")
    assert await host_usage(conn) == {"n1": (6_000, MEMORY)}
