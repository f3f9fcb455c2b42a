"""Re-export: the replayed cluster is ``gpusched_core.whatif.cluster``."""

from gpusched_core.whatif.cluster import ReplayCluster, ReplayNode, gang_shape

__all__ = ["ReplayCluster", "ReplayNode", "gang_shape"]
