"""A job on a node reaches nothing beyond itself: it runs in a directory of its own with an allowlisted
environment (never the agent's database URL or keys), the GPUs the agent gives it whatever its variables
say, no loader variables; and, where the agent runs as root and maps tenants to users, as its tenant's
unprivileged user, unable to read the agent's records, logs or keys or another job's directory."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from gpusched_common import signing
from services.node_agent.runner import JobExit, JobRunner, RunAs

PROBE = ('echo "cwd=$(pwd)"; echo "home=$HOME"; echo "uid=$(id -u)"; echo "gpus=$CUDA_VISIBLE_DEVICES"; '
         'echo "db=${GPUSCHED_DATABASE_URL:-none}"; echo "keys=${GPUSCHED_TENANT_KEYS_FILE:-none}"; '
         'echo "preload=${LD_PRELOAD:-none}"; echo "mine=$MINE"; '
         'cat ../../first.json > /dev/null 2>&1 && echo "records=read" || echo "records=denied"; '
         'cat ../../first.log > /dev/null 2>&1 && echo "logs=read" || echo "logs=denied"; '
         'cat ../../node.key > /dev/null 2>&1 && echo "nodekey=read" || echo "nodekey=denied"; '
         'ls ../.. > /dev/null 2>&1 && echo "list=allowed" || echo "list=denied"; '
         'ls ../first > /dev/null 2>&1 && echo "other=read" || echo "other=denied"; '
         'touch ../../forged.exit 2>/dev/null && echo "write=allowed" || echo "write=denied"; '
         'echo ckpt-1 > "$GPUSCHED_CHECKPOINT_FILE"')


async def run(runner: JobRunner, job_id: str, command: str, tenant: str = "research") -> dict[str, str]:
    record = await runner.start(job_id, ["sh", "-c", command], (3,),
                                {"MINE": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "LD_PRELOAD": "/x.so"},
                                tenant=tenant)
    assert not isinstance(record, JobExit), record
    done = await runner.wait(record)
    assert done.exit_code == 0, runner.log_path(job_id).read_text()
    return dict(line.split("=", 1) for line in runner.log_path(job_id).read_text().splitlines() if "=" in line)


@pytest.fixture
def agent_env(monkeypatch):
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", "postgresql://gpusched:secret@db/gpusched")
    monkeypatch.setenv("GPUSCHED_TENANT_KEYS_FILE", "/etc/gpusched/tenant-keys.yaml")


async def test_a_job_gets_its_own_directory_and_none_of_the_agent_s_secrets(tmp_path, agent_env):
    runner = JobRunner(tmp_path / "n1")
    seen = await run(runner, "j1", PROBE)
    assert seen["cwd"] == seen["home"] == str(runner.job_dir("j1"))
    assert (seen["db"], seen["keys"], seen["preload"], seen["mine"]) == ("none", "none", "none", "1")
    assert seen["gpus"] == "3"  # the agent's GPUs, not the job's claim to all eight
    assert runner.read_checkpoint("j1") == "ckpt-1"
    assert oct((tmp_path / "n1" / "j1.json").stat().st_mode & 0o777) == "0o600"
    assert oct(runner.log_path("j1").stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(os.geteuid() != 0, reason="running jobs as another user needs the agent to be root")
async def test_as_root_each_tenant_s_job_runs_as_its_user_and_reaches_nothing_of_the_agent(tmp_path, agent_env):
    nobody = pwd.getpwnam("nobody")
    with pytest.raises(ValueError, match="may not be passed through by other users"):  # pytest's 0700 tmp
        JobRunner(tmp_path / "n1", RunAs({"research": "nobody"}))
    base = Path(tempfile.mkdtemp(prefix="gpusched-isolation-"))
    try:
        base.chmod(0o711)
        await _as_nobody(base, nobody)
    finally:
        shutil.rmtree(base)


async def _as_nobody(base: Path, nobody: pwd.struct_passwd) -> None:
    runner = JobRunner(base / "n1", RunAs({"research": "nobody", "inference": "daemon"}))
    signing.ensure_key_file(base / "n1" / "node.key")  # the node's own key: what would let a job speak for it
    first = await runner.start("first", ["sh", "-c", "echo secret-output; echo s > mine"], (0,), {}, tenant="inference")
    assert not isinstance(first, JobExit)
    await runner.wait(first)
    seen = await run(runner, "j2", PROBE)
    assert seen["uid"] == str(nobody.pw_uid)
    assert (seen["records"], seen["logs"], seen["list"], seen["write"], seen["other"], seen["nodekey"]) == \
        ("denied",) * 6
    assert seen["db"] == "none" and seen["gpus"] == "3"
    assert runner.job_dir("j2").stat().st_uid == nobody.pw_uid
    assert runner.job_dir("first").stat().st_uid == pwd.getpwnam("daemon").pw_uid
    assert runner.read_checkpoint("j2") == "ckpt-1"  # the agent still reads what the job writes
    refused = await runner.start("j3", ["true"], (0,), {}, tenant="platform")
    assert isinstance(refused, JobExit) and "no user is mapped to run tenant platform" in (refused.error or "")


def test_the_users_mapping_is_read_with_clear_errors():
    assert RunAs.parse("") is None
    assert RunAs.parse("research=svc-r, *=nobody") == RunAs({"research": "svc-r"}, "nobody")
    with pytest.raises(ValueError, match="is not tenant=user"):
        RunAs.parse("research")
    assert "does not exist" in RunAs({"a": "no-such-user-here"}).user_for("a")
    assert "is root" in RunAs({"a": "root"}).user_for("a")
