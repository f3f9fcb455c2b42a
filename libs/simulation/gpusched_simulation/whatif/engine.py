"""Re-export: the replay is ``gpusched_core.whatif.engine``."""

from gpusched_core.whatif.engine import FINISH, STOP, Observer, Outcome, Replay, ReplayJob, Run, replay
from gpusched_core.whatif.preempt import PreemptionSettings

__all__ = ["FINISH", "STOP", "Observer", "Outcome", "PreemptionSettings", "Replay", "ReplayJob", "Run", "replay"]
