"""Preemption decisions (pure). This version selects no victims: it records why, so the wiring from
deferrals to decisions is real and the victim search of a later issue slots in here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Evaluation:
    job_id: str
    outcome: str
    reasons: tuple[str, ...]


def evaluate_deferral(job_id: str, deferral_reasons: tuple[str, ...]) -> Evaluation:
    return Evaluation(job_id, "no-preemption",
                      ("victim selection is not enabled in this version", *deferral_reasons))
