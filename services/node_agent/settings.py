"""The node agent's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpusched_common.settings import Settings
from gpusched_common.signing import TrustedKeys
from gpusched_core.agent.retention import DEFAULT_LOG_RETENTION_S


class AgentSettings(Settings):
    node_id: str = "node-1"
    nvml_backend: Literal["simulated", "real"] = "simulated"
    simulated_gpus: str = "H100-80GB:8"
    agent_work_dir: Path = Path(".gpusched/agents")
    heartbeat_interval_s: float = 10.0
    # node agent: labels (`rack=r1,gpusched.io/pool=train`), lease, health and fault injection
    node_labels: str = ""
    lease_ttl_s: float = 30.0
    fence_grace_s: float = 10.0  # SIGTERM -> SIGKILL grace when the agent stops jobs
    # a watchdog process beside the agent kills the node's jobs once its lease lapsed, also when the agent
    # cannot (paused, hung, dead): services/node_agent/watchdog.py
    agent_watchdog: bool = True
    health_interval_s: float = 2.0
    gpu_fault_policy: Literal["stop", "keep"] = "stop"
    health_ignored_xids: str = "13,31,43,45,68,109"  # application errors, not GPU faults
    mps_pipe_dir: Path | None = None  # CUDA MPS control pipe; shares are enforced only when it exists
    simulated_faults: str = ""  # e.g. `xid:3:79@30s,ecc:1@60s,thermal:2@10s`; see node_agent/faults.py
    # the log server the gateway reads jobs' output from; it runs only where the gateway's public key is given
    agent_gateway_public_key: str | None = None  # the gateway producer's public key (urlsafe base64)
    agent_gateway_public_key_file: Path | None = None  # or a file holding it (gpusched gateway-init --public-key-file)
    agent_log_host: str = "127.0.0.1"
    agent_log_port: int = 0  # 0: a free port
    agent_log_url: str | None = None  # what the node advertises (default http://host:port)
    agent_log_retention_s: float = Field(DEFAULT_LOG_RETENTION_S, gt=0)  # output of ended jobs kept this long
    # where the agent runs as root: which user runs each tenant's jobs (`research=svc-research,*=nobody`;
    # empty: jobs run as the agent's user), and what of the agent's environment jobs may see besides PATH,
    # the locale and the time zone (`NVIDIA_DRIVER_CAPABILITIES,LD_LIBRARY_PATH` for a node's driver)
    # the senders whose node commands this agent runs (placement's and preemption's public keys as
    # `placement=<key id>:<key>`, comma-separated, or a file of them); an unsigned or forged command is ignored and
    # counted. Without any, the agent refuses to start unless GPUSCHED_AGENT_ACCEPT_UNSIGNED_COMMANDS=true
    # (development only: then anyone who can write to the broker runs commands on the node)
    agent_command_keys: str = ""
    agent_command_keys_file: Path | None = None
    agent_accept_unsigned_commands: bool = False
    # the node's own key (issue 14): enrolled once with an operator's join token (`gpusched join-token create`),
    # then kept in <agent dir>/<node>/node.key; without either the agent does not start, unless
    # GPUSCHED_AGENT_UNENROLLED=true (development: its reports go unsigned)
    agent_join_token: str | None = None
    agent_join_token_file: Path | None = None
    agent_unenrolled: bool = False
    # each job in a cgroup of its own with its CPU and memory as limits, where the node allows it (auto:
    # cgroup v2, else v1, else none; services/node_agent/cgroups.py)
    agent_cgroups: Literal["auto", "off"] = "auto"
    agent_cgroup_root: Path = Path("/sys/fs/cgroup")
    # jobs with an image run in containers: `auto` (podman, else docker, where installed), `none`, or the
    # runtime's command line (`podman --runtime runc`); what every `run` also gets (`--ulimit nproc=4096:4096`)
    agent_container_runtime: str = "auto"
    agent_container_run_args: str = ""
    agent_job_users: str = ""
    agent_job_env_passthrough: str = ""
    simulated_nodes: int = 1  # >1: one process runs node_id-1..N as a fleet of simulated agents

    def command_keys(self) -> TrustedKeys | None:
        """Whose commands the agent runs (None: anyone's, development only); ValueError where none is
        configured and unsigned commands are not accepted, or a key cannot be read."""
        keys = TrustedKeys.parse(self.agent_command_keys.split(","))
        if self.agent_command_keys_file is not None:
            keys = keys.merged(TrustedKeys.read(self.agent_command_keys_file))
        if len(keys):
            return keys
        if self.agent_accept_unsigned_commands:
            return None
        raise ValueError("the node agent has no trusted command keys (GPUSCHED_AGENT_COMMAND_KEYS or "
                         "GPUSCHED_AGENT_COMMAND_KEYS_FILE: placement's and preemption's public keys); set "
                         "GPUSCHED_AGENT_ACCEPT_UNSIGNED_COMMANDS=true only for development")

    def join_token(self) -> str | None:
        """The join token given, or read from its file (None: neither)."""
        if self.agent_join_token or self.agent_join_token_file is None:
            return self.agent_join_token or None
        try:
            return self.agent_join_token_file.read_text().strip() or None
        except OSError as exc:
            raise ValueError(f"GPUSCHED_AGENT_JOIN_TOKEN_FILE {str(self.agent_join_token_file)!r} cannot be read: "
                             f"{exc.strerror}") from None

    def gateway_public_key(self) -> str | None:
        """The gateway's public key: given, or read from its file (None: neither; no log server runs)."""
        path = self.agent_gateway_public_key_file
        if self.agent_gateway_public_key is not None or path is None:
            return self.agent_gateway_public_key
        try:
            return path.read_text().strip() or None
        except OSError as exc:
            raise RuntimeError(f"GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE {str(path)!r} cannot be read: {exc}") from None
