"""The pool's reset when it takes a connection back (``db._reset_connection``), on real PostgreSQL: a connection
that took no session state goes back without asyncpg's reset query (a round trip on every release), one
left in a transaction is rolled back, and one marked as keeping session state (the outbox relay's: a session
advisory lock, a LISTEN) is fully reset, so its lock is free for another connection."""

from __future__ import annotations

from gpusched_common.db import connect, create_pool, keeps_session_state

LOCK = 990_001


async def last_query_of(observer, pid: int) -> str:
    return await observer.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)


async def test_a_plain_connection_goes_back_without_a_reset_query_and_a_marked_one_is_fully_reset(database_url):
    pool = await create_pool(database_url, min_size=1, max_size=1)
    observer = await connect(database_url)
    try:
        async with pool.acquire() as conn:
            pid = conn.get_server_pid()
            async with conn.transaction():
                await conn.fetchval("SELECT 42 AS plain_work")
        assert (await last_query_of(observer, pid)).startswith("COMMIT")  # nothing ran after it

        async with pool.acquire() as conn:  # left in a transaction: rolled back on release
            assert conn.get_server_pid() == pid
            tx = conn.transaction()
            await tx.start()
            await conn.execute("CREATE TEMP TABLE left_open (x int)")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('pg_temp.left_open')") is None

        async with pool.acquire() as conn:
            keeps_session_state(conn)
            assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK)
            await conn.execute("LISTEN some_channel")
        assert "pg_advisory_unlock_all" in await last_query_of(observer, pid)
        assert await observer.fetchval("SELECT pg_try_advisory_lock($1)", LOCK)  # the session lock went with it
        async with pool.acquire() as conn:  # marked once: the next release is plain again
            await conn.fetchval("SELECT 7 AS plain_again")
        assert "plain_again" in await last_query_of(observer, pid)
    finally:
        await observer.close()
        await pool.close()
