"""The campaign's seeded workload (pure): jobs of every shape, from three tenants of one cohort, some urgent
(they preempt), one tenant heavy enough to borrow (reclaims follow), a few that fail on purpose and some
that are cancelled; every job runs ``runjob`` so its runs are on record."""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpusched_common import events as ev

WHOLE_MODEL = "H100-80GB"
MIG_MODEL = "A100-80GB"
PROBE_MODEL = "L4-24GB"
TENANTS = ("team-a", "team-b", "team-c")
PROBE_TENANT = "probe"
FAILING_EXIT = 3


@dataclass(frozen=True)
class Planned:
    spec: ev.JobSpec
    cancel_after_s: float | None  # cancelled this long after it was acknowledged (None: never)
    expected_exit: int


def job_command(python: str, runjob: str, runs_dir: str, seconds: float, exit_code: int) -> list[str]:
    return [python, "-S", runjob, runs_dir, f"{seconds:.2f}", str(exit_code)]


def plan(seed: int, count: int, *, python: str, runjob: str, runs_dir: str) -> list[Planned]:
    rng = random.Random(seed * 7919 + 1)
    out = []
    for i in range(count):
        tenant = rng.choices(TENANTS, weights=[50, 30, 20])[0]
        seconds = round(rng.uniform(0.5, 2.5), 2)
        code = FAILING_EXIT if rng.random() < 0.04 else 0
        shape = rng.choices(["whole", "gang", "share", "mig"], weights=[58, 8, 16, 18])[0]
        fields: dict = {"tenant": tenant, "gpu_model": WHOLE_MODEL, "name": f"chaos-{i}",
                        "priority": 100 if rng.random() < 0.1 else 0,
                        "command": job_command(python, runjob, runs_dir, seconds, code)}
        if shape == "whole":
            fields["gpus"] = rng.choices([1, 2, 4, 8], weights=[50, 30, 15, 5])[0]
        elif shape == "gang":
            fields.update(gpus=rng.choice([2, 4]), nodes=2)
        elif shape == "share":
            fields.update(gpus=1, gpu_share=ev.GpuShareSpec(milli=rng.choice([250, 500])))
        else:
            fields.update(gpus=1, gpu_model=MIG_MODEL, mig_profile=rng.choice(["1g.10gb", "2g.20gb", "3g.40gb"]))
        cancel = round(rng.uniform(0.0, 4.0), 2) if rng.random() < 0.05 else None
        out.append(Planned(ev.JobSpec(**fields), cancel, code))
    return out


def probe_spec(python: str, runjob: str, runs_dir: str, n: int) -> ev.JobSpec:
    """A job of the probe tenant on the probe node's model: how soon new work runs after a fault."""
    return ev.JobSpec(tenant=PROBE_TENANT, gpus=1, gpu_model=PROBE_MODEL, name=f"probe-{n}", priority=0,
                      command=job_command(python, runjob, runs_dir, 0.2, 0))


def tenancy(whole_gpus: int, mig_gpus: int, probe_gpus: int) -> dict:
    """Cohort ``chaos``: team-a may borrow without limit, team-b and team-c up to a limit (each limit fits
    the largest job, one whole node); cohort ``probes`` holds the probe node's model alone."""
    def quota(share: float, borrowing: float | None = None) -> dict:
        out = {}
        for model, gpus in ((WHOLE_MODEL, whole_gpus), (MIG_MODEL, mig_gpus)):
            entry = {"nominal": round(gpus * share, 3)}
            if borrowing is not None:
                entry["borrowing_limit"] = round(gpus * borrowing, 3)
            out[model] = entry
        return out

    return {"version": 1, "revision": 1, "flavors": [WHOLE_MODEL, MIG_MODEL, PROBE_MODEL],
            "priority_classes": {"urgent": 100, "high": 50, "normal": 10, "batch": 0},
            "default_priority_class": "batch", "fair_share": {"half_life_s": 600},
            "tenants": [{"name": "chaos", "children": [
                {"name": "team-a", "quota": quota(0.5)},
                {"name": "team-b", "quota": quota(0.3, borrowing=0.2)},
                {"name": "team-c", "quota": quota(0.2, borrowing=0.15)}]},
                {"name": "probes", "children": [{"name": PROBE_TENANT,
                                                 "quota": {PROBE_MODEL: {"nominal": probe_gpus}}}]}]}
