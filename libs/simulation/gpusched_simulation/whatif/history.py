"""Re-export: history rows as replay values are ``gpusched_core.whatif.history``."""

from gpusched_core.whatif.history import replay_jobs, replay_nodes

__all__ = ["replay_jobs", "replay_nodes"]
