"""Start-time estimates of waiting jobs (``gpusched queue --start``, GET /v1/queue/estimates), pure: plain
values in (the nodes, running jobs, waiting jobs in queue order, finished runs, the tenancy, ``now``),
one ``Estimate`` per waiting job out. See ``forward`` for the simulation and ``runtimes`` for run-times."""

from .forward import plan_estimates
from .hypothetical import Forward, estimate_new_job, wait_words, with_new_job
from .model import (
    EstimateConfig,
    Estimate,
    FinishedRun,
    Hold,
    NodeGpus,
    RunningJob,
    RuntimeEstimate,
    Shape,
    WaitingJob,
)
from .runtimes import RuntimeModel

__all__ = ["Estimate", "EstimateConfig", "FinishedRun", "Forward", "Hold", "NodeGpus", "RunningJob", "RuntimeEstimate",
           "RuntimeModel", "Shape", "WaitingJob", "estimate_new_job", "plan_estimates", "wait_words",
           "with_new_job"]
