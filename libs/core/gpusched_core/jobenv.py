"""A job's environment (pure): what a user may set (``check_env``, at admission and the gateway) and what
a job gets on its node (``job_environment``, in the agent). A job never inherits the agent's environment
(its database URL, its keys): only an allowlist of harmless variables passes (``PATH``, the locale, the
time zone, and what an operator adds for the node's driver), then the job's own variables, then what
placement tells it (its gang, its host resources, its checkpoint), and last what the agent owns (the GPUs
it may see, its files), which nothing before can override. Loader variables (``LD_PRELOAD`` and kin) are
refused at admission and dropped on the node."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MAX_ENV_VARS = 256
MAX_ENV_BYTES = 64 * 1024  # keys and values together
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

# variables that change what a process loads or runs before the job's own code
LOADER_PREFIXES = ("LD_", "DYLD_")
LOADER_NAMES = frozenset({"PYTHONSTARTUP", "PYTHONINSPECT", "BASH_ENV", "ENV", "PERL5OPT", "NODE_OPTIONS",
                          "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GCONV_PATH", "MALLOC_CHECK_"})
# set by gpusched for the job (its GPUs, its files, its gang): a user's value would lie to it or escape a limit
RESERVED_PREFIXES = ("GPUSCHED_", "CUDA_MPS_")
RESERVED_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})
# what a job may get from the agent's own environment (an operator adds more per node: the driver's paths)
BASE_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def is_loader_variable(key: str) -> bool:
    return key.startswith(LOADER_PREFIXES) or key in LOADER_NAMES


def check_env(env: Mapping[str, str]) -> list[str]:
    """Every reason a job's own environment is refused: its size, each key's form, NUL bytes, loader
    variables and names gpusched sets itself."""
    reasons = []
    if len(env) > MAX_ENV_VARS:
        reasons.append(f"env has {len(env)} variables; at most {MAX_ENV_VARS}")
    if sum(len(k.encode()) + len(v.encode()) for k, v in env.items()) > MAX_ENV_BYTES:
        reasons.append(f"env is larger than {MAX_ENV_BYTES} bytes")
    for key, value in env.items():
        if not _KEY.match(key):
            reasons.append(f"env key {key[:40]!r} is not a variable name (letters, digits and _, not first a digit)")
        elif is_loader_variable(key):
            reasons.append(f"env {key} changes what the job loads before its own code; it may not be set")
        elif key.startswith(RESERVED_PREFIXES) or key in RESERVED_NAMES:
            reasons.append(f"env {key} is set by gpusched for the job; it may not be set")
        if "\0" in value:
            reasons.append(f"env {key[:40]} holds a NUL byte")
    return reasons


def check_command(command: Iterable[str]) -> list[str]:
    return ["command holds a NUL byte"] if any("\0" in part for part in command) else []


def job_environment(agent_env: Mapping[str, str], passthrough: Iterable[str], job_env: Mapping[str, str],
                    owned: Mapping[str, str]) -> dict[str, str]:
    """The job's whole environment: the allowlisted part of the agent's (``BASE_ALLOWED`` and
    ``passthrough``), then ``job_env`` (its own and placement's, loader variables dropped), then what the
    agent ``owned`` (last: nothing overrides the GPUs it may see or its files)."""
    allowed = set(BASE_ALLOWED) | set(passthrough)
    base = {k: v for k, v in agent_env.items() if k in allowed}
    base.setdefault("PATH", DEFAULT_PATH)
    given = {k: v for k, v in job_env.items() if _KEY.match(k) and not is_loader_variable(k) and "\0" not in v}
    return {**base, **given, **owned}
