"""``make bench-placement`` on a tiny cluster: both ways of counting (cold and steady), the ratios to
bestfit and the goal lines are written to its JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_placement", ROOT / "benchmarks" / "bench_placement.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_placement", module)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_times_cold_and_steady_and_scales_the_goals_by_bestfit(tmp_path: Path, capsys) -> None:
    bench = _bench()
    bench.GOALS = {"ours": {40: 1_000_000}}
    bench.BESTFIT_AT_GOALS = {40: 1}
    out = tmp_path / "placement.json"
    assert bench.main(["--sizes", "40", "--decisions", "30", "--warmup", "5", "--policies", "bestfit,ours",
                       "--out", str(out)]) == 0  # fmt: skip
    figures = json.loads(out.read_text())
    ours = next(r for r in figures["results"] if r["policy"] == "ours")
    assert ours["decisions"] == 30 and ours["decisions_per_s"] > 0 and ours["steady_decisions_per_s"] > 0
    assert ours["cost_vs_bestfit"] > 0 and ours["steady_cost_vs_bestfit"] > 0
    cold, steady = figures["goals"]
    assert cold.startswith("goal ours (cold): ") and steady.startswith("goal ours (steady): ")
    assert "not met against" in cold  # a goal a million times bestfit's own rate here
    printed = capsys.readouterr().out
    assert "cold: a shape's first uses counted" in printed and "steady: every shape seen before" in printed


def test_steady_shows_the_policy_every_shape_before_timing() -> None:
    bench = _bench()
    snapshot = bench.synthetic_cluster(30)
    requests = bench.request_stream(40)
    seen: list[str] = []
    original = bench.place

    def counting(snapshot, request, policy, **kwargs):
        seen.append(str(request.id))
        return original(snapshot, request, policy, **kwargs)

    bench.place = counting
    try:
        bench.measure("ours", snapshot, requests, 5, steady=True)
    finally:
        bench.place = original
    assert seen == [str(r.id) for r in requests] * 2  # every request shown once, then the timed stream
