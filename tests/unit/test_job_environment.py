"""A job's environment: what a user may set is checked with reasons (loader variables, names gpusched
sets, malformed keys, NUL bytes, size), and on the node a job gets only an allowlist of the agent's
environment, its own variables, then what the agent owns, which nothing overrides."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common import events as ev
from gpusched_core.jobenv import MAX_ENV_VARS, check_command, check_env, job_environment
from gpusched_core.submission import AdmissionLimits, check_spec


@pytest.mark.parametrize("env, says", [
    ({"LD_PRELOAD": "/tmp/evil.so"}, "changes what the job loads"),
    ({"LD_LIBRARY_PATH": "/tmp"}, "changes what the job loads"),
    ({"DYLD_INSERT_LIBRARIES": "x"}, "changes what the job loads"),
    ({"BASH_ENV": "/tmp/x"}, "changes what the job loads"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "set by gpusched"),
    ({"GPUSCHED_JOB_ID": "other"}, "set by gpusched"),
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, "set by gpusched"),
    ({"A=B": "x"}, "not a variable name"),
    ({"1X": "x"}, "not a variable name"),
    ({"": "x"}, "not a variable name"),
    ({"X": "a\0b"}, "NUL byte"),
    ({f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}, "at most"),
    ({"BIG": "x" * 70_000}, "larger than"),
])
def test_a_user_s_environment_is_refused_with_the_reason(env, says):
    assert any(says in reason for reason in check_env(env)), check_env(env)


def test_ordinary_variables_pass():
    assert check_env({"OMP_NUM_THREADS": "4", "WANDB_PROJECT": "x", "_private": "", "MASTER_PORT": "29500"}) == []


def test_admission_refuses_them_too():
    spec = ev.JobSpec(tenant="a", gpus=1, command=["python", "x\0"], env={"LD_PRELOAD": "x"})
    reasons = check_spec(spec, AdmissionLimits())
    assert any("LD_PRELOAD" in r for r in reasons) and "command holds a NUL byte" in reasons
    assert check_command(["true"]) == []


AGENT_ENV = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "GPUSCHED_DATABASE_URL": "postgresql://u:secret@db/x",
             "GPUSCHED_TENANT_KEYS_FILE": "/etc/keys", "AWS_SECRET_ACCESS_KEY": "k", "NVIDIA_DRIVER_CAPABILITIES": "all"}


def test_a_job_never_inherits_the_agent_s_secrets():
    env = job_environment(AGENT_ENV, (), {"MINE": "1"}, {"CUDA_VISIBLE_DEVICES": "2"})
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "MINE": "1", "CUDA_VISIBLE_DEVICES": "2"}


def test_an_operator_passes_driver_variables_through():
    env = job_environment(AGENT_ENV, ("NVIDIA_DRIVER_CAPABILITIES",), {}, {})
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "all" and "GPUSCHED_DATABASE_URL" not in env


def test_what_the_agent_owns_wins_and_loader_variables_are_dropped_on_the_node():
    forged = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "LD_PRELOAD": "/tmp/x.so", "BAD=KEY": "1", "N": "a\0"}
    env = job_environment({}, (), forged, {"CUDA_VISIBLE_DEVICES": "3", "GPUSCHED_JOB_DIR": "/jobs/j1"})
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "3", "GPUSCHED_JOB_DIR": "/jobs/j1"}


@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12), max_size=8),
       st.dictionaries(st.sampled_from(["CUDA_VISIBLE_DEVICES", "GPUSCHED_JOB_ID", "HOME"]), st.text(max_size=5)))
def test_owned_variables_always_hold(job_env, owned):
    env = job_environment(AGENT_ENV, (), job_env, owned)
    assert all(env[k] == v for k, v in owned.items())
    assert "GPUSCHED_DATABASE_URL" not in env or owned.get("GPUSCHED_DATABASE_URL")
    assert not any(k.startswith("LD_") for k in env)
