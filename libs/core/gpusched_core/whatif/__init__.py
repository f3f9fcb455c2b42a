"""What-if on the cluster's own history (``gpusched whatif``, POST /v1/whatif), pure: the recorded
submissions replayed through today's nodes under placement policies by name and, optionally, other
tenancies, with the live preemption core choosing victims for higher-priority jobs (``engine``,
``preempt``); figures per run (``report``); history rows as values (``history``); one run per policy and
tenancy (``run``). No I/O, clock or random source: the callers (the CLI, the gateway) read the history."""

from .cluster import ReplayCluster, ReplayNode, gang_shape
from .engine import Outcome, Replay, ReplayJob, Stopped, replay
from .history import replay_jobs, replay_nodes
from .preempt import PreemptionSettings
from .report import percentile, summarise
from .run import run_all

__all__ = ["Outcome", "PreemptionSettings", "Replay", "ReplayCluster", "ReplayJob", "ReplayNode", "gang_shape",
           "percentile", "replay", "replay_jobs", "replay_nodes", "run_all", "summarise", "Stopped"]
