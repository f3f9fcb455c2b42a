"""placement_version (migrations 012, 035) on real PostgreSQL: it moves when a transaction changed what a
placement cycle reads, once per transaction, and not for a statement that changed nothing."""

from __future__ import annotations

from gpusched_common.db import connect

NODE = ("INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend, registered_at, last_seen_at,"
        " lease_epoch, status) VALUES ($1, $1, '{}'::jsonb, 1000, 1024, 'simulated', now(), now(), 1, 'Ready')")


async def version(conn) -> int:
    return await conn.fetchval("SELECT version FROM placement_version")


async def test_the_version_moves_once_per_changing_transaction_and_never_for_a_statement_that_changed_nothing(
        database_url):
    conn = await connect(database_url)
    try:
        v0 = await version(conn)
        await conn.execute("DELETE FROM gpu_nominations WHERE job_id = 'nobody'")
        await conn.execute("UPDATE nodes SET status = 'Ready' WHERE node_id = 'nowhere'")
        assert await version(conn) == v0

        async with conn.transaction():
            await conn.execute(NODE, "n1")
            moved = await version(conn)
            await conn.execute(NODE, "n2")
            await conn.execute("UPDATE nodes SET cordoned_at = now() WHERE node_id = 'n2'")
            assert moved != v0 and await version(conn) == moved  # once in the transaction
        await conn.execute("UPDATE nodes SET last_seen_at = now()")  # a heartbeat: not what placement reads
        assert await version(conn) == moved

        await conn.execute("UPDATE nodes SET cordoned_at = NULL WHERE node_id = 'n2'")
        assert await version(conn) != moved
    finally:
        await conn.close()


async def test_a_change_after_a_rolled_back_savepoint_still_moves_the_version(database_url):
    conn = await connect(database_url)
    try:
        v0 = await version(conn)
        async with conn.transaction():
            try:
                async with conn.transaction():  # a savepoint
                    await conn.execute(NODE, "n1")
                    raise RuntimeError("roll the savepoint back")
            except RuntimeError:
                pass
            assert await version(conn) == v0
            await conn.execute(NODE, "n2")
        assert await version(conn) != v0
    finally:
        await conn.close()
