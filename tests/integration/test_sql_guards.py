"""The database's own guards agree with the code's constants: a CHECK or a SQL function that drifts from
the rule it mirrors fails here (each rule has one home in code; PostgreSQL enforces it too)."""

from __future__ import annotations

from datetime import datetime, timezone

import asyncpg
import pytest

from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.ids import job_stream

from gpusched_core.placement.mig import MIG_MEMORY_SLICES
from gpusched_core.placement.model import MILLI_PER_GPU
from services.placement.store import ALLOCATION_COLUMNS, upsert_node

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def mig_node() -> ev.NodeRegistered:
    return ev.NodeRegistered(
        node_id="n1", hostname="n1", cpu_milli=64_000, memory_mib=512_000, nvml_backend="simulated", lease_epoch=1,
        gpus=[ev.GpuInventory(index=0, uuid="GPU-0", model="A100-80GB", memory_mib=81_920, mig_enabled=True),
              ev.GpuInventory(index=1, uuid="GPU-1", model="A100-80GB", memory_mib=81_920)])


async def insert(conn: asyncpg.Connection, **row: object) -> bool:
    """Try one gpu_allocations row in a savepoint that is rolled back; True when PostgreSQL accepted it."""
    values = {"node_id": "n1", "gpu_index": 0, "job_id": "j", "allocated_at": T0, "milli": MILLI_PER_GPU,
              "memory_mib": 0, "mig_profile": None, "mig_start": None, "mig_memory_slices": None,
              "host_cpu_milli": 0, "host_memory_mib": 0, **row}
    columns = ", ".join(ALLOCATION_COLUMNS)
    params = ", ".join(f"${n}" for n in range(1, len(ALLOCATION_COLUMNS) + 1))
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(f"INSERT INTO gpu_allocations ({columns}) VALUES ({params})",
                           *(values[c] for c in ALLOCATION_COLUMNS))
        return True
    except asyncpg.IntegrityConstraintViolationError:
        return False
    finally:
        await tx.rollback()


@pytest.fixture
async def conn(database_url: str):
    connection = await connect(database_url)
    await upsert_node(connection, mig_node(), T0)
    yield connection
    await connection.close()


async def test_the_sql_job_stream_is_the_code_s(conn):
    for job_id in ("j1", "team-a:train.7", "x" * 128):
        assert await conn.fetchval("SELECT job_stream($1)", job_id) == job_stream(job_id)


async def test_a_mig_instance_fits_the_gpu_s_memory_slices_exactly_as_the_geometry_says(conn):
    for start in range(-1, MIG_MEMORY_SLICES + 1):
        for slices in range(0, MIG_MEMORY_SLICES + 2):
            fits = start >= 0 and slices >= 1 and start + slices <= MIG_MEMORY_SLICES
            accepted = await insert(conn, milli=1, mig_profile="1g.10gb", mig_start=start, mig_memory_slices=slices)
            assert accepted == fits, (start, slices)


async def test_a_gpu_holds_at_most_its_milli_and_never_two_overlapping_slices(conn):
    assert await insert(conn, milli=MILLI_PER_GPU)
    assert not await insert(conn, milli=MILLI_PER_GPU + 1)
    assert not await insert(conn, milli=0)
    async with conn.transaction():
        await conn.execute("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, milli)"
                           " VALUES ('n1', 1, 'a', $1, $2)", T0, MILLI_PER_GPU // 2)
        assert await insert(conn, gpu_index=1, job_id="b", milli=MILLI_PER_GPU // 2)
        assert not await insert(conn, gpu_index=1, job_id="b", milli=MILLI_PER_GPU // 2 + 1)
        await conn.execute("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, milli, mig_profile,"
                           " mig_start, mig_memory_slices) VALUES ('n1', 0, 'm', $1, 1, '3g.40gb', 0, 4)", T0)
        assert not await insert(conn, job_id="o", milli=1, mig_profile="1g.10gb", mig_start=3, mig_memory_slices=1)
        assert await insert(conn, job_id="o", milli=1, mig_profile="3g.40gb", mig_start=4, mig_memory_slices=4)
