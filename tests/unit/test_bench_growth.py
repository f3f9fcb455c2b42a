"""The growth benchmark's pure parts (issue 16, part 4): its cells, its backlog tenant, how growth is stated."""

from __future__ import annotations

import argparse

import pytest

from gpusched_core.quota.jobs import cohort_of
from gpusched_core.quota.loader import parse_tenancy
from gpusched_core.quota.units import UNITS_PER_GPU
from services.node_agent.simulated import SimulatedNvml

from gpusched_cli.bench_growth import BACKLOG, backlog_specs, cell_row, growth_tenancy, memory_rows, parse_counts, with_growth

BACKLOG_FIGURES = {"backlog_s": 10.0, "backlog_per_s": 100.0, "quota_kib_per_pending_job": 0.9}


def probe(placed: int, cpu_ms: float | None) -> dict:
    return {"placed": placed, "placed_per_s": 5.0, "submit_to_placed_p50_ms": 900.0, "submit_to_placed_p99_ms": 2000.0,
            "cpu_ms_per_job_total": cpu_ms, "cpu_ms_per_job": {"quota": cpu_ms, "placement": 1.0},
            "idle_cores_total": 0.4, "idle_cores": {"quota": 0.1}, "rss_mib": {"quota": 80.0}}


@pytest.mark.parametrize("text, counts", [("100,1000,5000", [100, 1000, 5000]), ("50_000", [50000]),
                                          ("7,", [7])])
def test_counts_are_read_from_a_comma_separated_list(text, counts):
    assert parse_counts(text) == counts


@pytest.mark.parametrize("text", ["", "a,b", "0", "100,-1", "1.5"])
def test_counts_that_are_not_positive_whole_numbers_are_refused_with_the_text(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse_counts(text)


def test_the_backlog_tenant_shares_the_teams_cohort_with_one_gpu_and_no_borrowing():
    tenancy = parse_tenancy(growth_tenancy(100))
    assert cohort_of(tenancy, BACKLOG) == cohort_of(tenancy, "research")
    quota = tenancy.tenants[BACKLOG].quota["H100-80GB"]
    assert (quota.nominal, quota.borrowing_limit) == (UNITS_PER_GPU, 0)
    assert all(j.tenant == BACKLOG and j.gpus == 1 for j in backlog_specs(5)) and len(backlog_specs(5)) == 5


def test_growth_is_each_cell_s_cpu_per_job_over_the_first_cell_s():
    rows = with_growth([cell_row(100, 1000, BACKLOG_FIGURES, probe(300, 20.0)),
                        cell_row(1000, 1000, BACKLOG_FIGURES, probe(300, 50.0)),
                        cell_row(5000, 1000, BACKLOG_FIGURES, probe(0, None))])
    assert [r["cpu_growth"] for r in rows] == [1.0, 2.5, None]
    assert (rows[1]["nodes"], rows[1]["pending"], rows[1]["placed"]) == (1000, 1000, 300)
    assert rows[0]["quota_cpu_ms_per_job"] == 20.0 and rows[0]["backlog_per_s"] == 100.0


def test_memory_per_added_job_compares_a_cell_with_the_last_smaller_backlog_on_as_many_nodes():
    def backlog(mib: float | None) -> dict:
        return {**BACKLOG_FIGURES, "backlog_mib": {} if mib is None else {"quota": mib, "metrics": mib / 2}}

    rows = with_growth([cell_row(100, 1000, backlog(12.0), probe(300, 20.0)),
                        cell_row(100, 10000, backlog(21.0), probe(300, 20.0)),
                        cell_row(1000, 1000, backlog(30.0), probe(300, 20.0)),
                        cell_row(100, 50000, backlog(46.0), probe(300, 20.0)),
                        cell_row(1000, 10000, backlog(None), probe(300, 20.0))])
    assert [r["quota_kib_per_added_job"] for r in rows] == [None, 1.02, None, 0.64, None]
    assert rows[3]["kib_per_added_job"] == {"quota": 0.64, "metrics": 0.32}
    assert memory_rows(rows) == [(100, 10000, "quota", None, None, 1.02, None, None, 0.51, "no"),
                                 (100, 50000, "quota", None, None, 0.64, None, None, 0.32, "yes")]


def test_memory_per_added_job_compares_only_cells_whose_backlog_waits_in_the_same_place():
    quota = {**BACKLOG_FIGURES, "backlog_mib": {"placement": 1.0}}
    placement = {**BACKLOG_FIGURES, "backlog_mib": {"placement": 11.0}}
    rows = with_growth([cell_row(100, 1000, quota, probe(300, 20.0)),
                        cell_row(100, 10000, placement, probe(300, 20.0), "placement"),
                        cell_row(100, 20000, {**placement, "backlog_mib": {"placement": 16.0}}, probe(300, 20.0),
                                 "placement")])
    assert [r["kib_per_added_job"] for r in rows] == [{}, {}, {"placement": 0.51}]
    assert [r["backlog_waits"] for r in rows] == ["quota", "placement", "placement"]


def test_a_backlog_waiting_in_placement_has_quota_for_every_job_in_a_cohort_of_its_own_and_fits_no_node():
    tenancy = parse_tenancy(growth_tenancy(100, "placement", 5000))
    assert cohort_of(tenancy, BACKLOG) != cohort_of(tenancy, "research")
    assert tenancy.tenants[BACKLOG].quota["H100-80GB"].nominal == 5000 * UNITS_PER_GPU
    node_cpu = SimulatedNvml("n1", "H100-80GB:8").node_info().cpu_milli  # what a bench's simulated node has
    specs = backlog_specs(3, "placement")
    assert all(s.cpu_milli > node_cpu and s.gpus == 1 for s in specs) and len(specs) == 3
    assert all(s.cpu_milli == 0 for s in backlog_specs(3))


async def test_a_failed_cell_is_reported_and_the_rest_still_run_each_kept_as_it_ends(monkeypatch):
    from gpusched_cli import bench_growth

    async def measure(args, nodes, pending, progress):
        if nodes == 5000:
            raise RuntimeError("5000 node(s) did not register within 1000s")
        return cell_row(nodes, pending, BACKLOG_FIGURES, probe(300, 10.0 * nodes / 100))

    monkeypatch.setattr(bench_growth, "measure_cell", measure)
    kept: list[list[dict]] = []
    args = argparse.Namespace(nodes="100,5000,1000", pending="1000", backlog_waits="quota")
    rows = await bench_growth.run_growth(args, progress=lambda line: None, done=kept.append)
    assert [len(k) for k in kept] == [1, 2, 3] and kept[-1] == rows
    assert "did not register" in rows[1]["error"] and rows[1]["cpu_growth"] is None
    assert [r["cpu_growth"] for r in (rows[0], rows[2])] == [1.0, 10.0]
