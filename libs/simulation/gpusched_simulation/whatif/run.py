"""Re-export: one run per policy and tenancy is ``gpusched_core.whatif.run``."""

from gpusched_core.whatif.run import run_all

__all__ = ["run_all"]
