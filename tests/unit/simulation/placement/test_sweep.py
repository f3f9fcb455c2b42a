"""The sweep's table: medians per trace and policy beside FGD's published median."""

from __future__ import annotations

import json
from pathlib import Path

from gpusched_simulation.placement import sweep


def runs() -> list[dict[str, object]]:
    values = {("cpu100", "fgd"): [4.9, 4.7, 4.8], ("cpu100", "ours"): [4.5, 4.4, 4.6]}
    return [{"trace": t, "policy": p, "seed": 42 + i, "unallocated_at_100": v, "wall_s": 1.0}
            for (t, p), vs in values.items() for i, v in enumerate(vs)]  # fmt: skip


def test_the_table_gives_medians_and_ours_against_the_published_figure(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    (tmp_path / "analysis_allo_discrete.csv").write_text(
        "workload,sc_policy,tune,seed,total_gpus,100\nopenb_pod_list_cpu100,06-FGD,1.3,42,6212,95.0\n")
    monkeypatch.setattr(sweep, "published_dir", lambda: tmp_path)
    text = sweep.markdown(runs(), ["cpu100"], ["fgd", "ours"], [42, 43, 44])
    assert "| cpu100 | 3 | 4.80 | 4.50 | 5.00 | -0.50 |" in text


def test_merge_reads_json_files_and_sweep_logs(tmp_path: Path) -> None:
    as_json, as_log = tmp_path / "a.json", tmp_path / "b.err"
    as_json.write_text(json.dumps(runs()[:3]))
    as_log.write_text("\n".join(json.dumps(r) for r in runs()[3:]) + "\nprogress line\n")
    assert sweep._read_runs(as_json) + sweep._read_runs(as_log) == runs()


def test_shared_traces_and_every_published_variant_are_in_the_default_sweep() -> None:
    assert "shared:gpuspec10" in sweep.ALL_TRACES and "gpuspec33" in sweep.ALL_TRACES
    assert sweep.published_name("shared:cpu050") == "openb_pod_list_cpu050"
