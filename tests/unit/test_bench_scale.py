"""The scale benchmark's pure parts (issue 16): its workload, how it combines processes, how it reads CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpusched_cli.bench_scale import gpu_demand, per_service, scale_workload
from gpusched_cli.proc_usage import busy_cores, machine_cpu_s, usage
from gpusched_cli.start_floor import floor_job_start_ms


def test_the_burst_is_the_documented_mix_of_shapes_and_tenants():
    jobs = scale_workload(4000, seed=16)
    assert len(jobs) == 4000 and len({j.name for j in jobs}) == 4000
    share = sum(1 for j in jobs if j.gpu_share is not None) / len(jobs)
    gangs = sum(1 for j in jobs if j.nodes == 2) / len(jobs)
    single = sum(1 for j in jobs if j.gpu_share is None and j.nodes == 1 and j.gpus == 1) / len(jobs)
    assert 0.17 < share < 0.23 and 0.035 < gangs < 0.065 and 0.42 < single < 0.48
    assert {j.tenant for j in jobs} == {"research", "inference", "platform", "ml-eval"}
    assert all(j.command == ["sleep", "3600"] for j in jobs)
    assert scale_workload(50, seed=16) == scale_workload(50, seed=16)  # the same burst every run


def test_a_job_s_gpu_demand_counts_shares_and_gangs():
    by_shape = {(j.gpus, j.nodes, j.gpu_share.milli if j.gpu_share else None): gpu_demand(j)
                for j in scale_workload(500, seed=3)}
    assert by_shape[(8, 2, None)] == 16 and by_shape[(1, 1, 250)] == 0.25 and by_shape[(4, 1, None)] == 4


def test_fleet_processes_add_up_to_one_agents_entry():
    combined = per_service({"agent-fleet1": 1.0, "agent-fleet2": 2.0, "quota": 0.5})
    assert combined == {"agents": 3.0, "quota": 0.5}
    assert per_service({"agent-fleet1": 10.0, "agent-fleet2": 30.0}, max) == {"agents": 30.0}


def test_cpu_is_read_for_a_process_and_its_whole_tree_only_when_asked():
    busy = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass\n"
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {busy!r}])"])
    try:
        time.sleep(1.2)  # the child burns CPU meanwhile
        pids = {"tree": parent.pid, "alone": parent.pid, "me": os.getpid()}
        read = usage(pids, trees=frozenset({"tree"}))
        assert read["tree"].cpu_s > read["alone"].cpu_s + 0.3  # the child's CPU counted with its parent's
        assert read["me"].rss_mib > 1
    finally:
        parent.wait(timeout=10)
    assert usage({"gone": parent.pid})["gone"].cpu_s == 0.0


def test_the_machine_s_busy_cores_leave_out_idle_and_iowait_only():
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal (guest columns after them are left out)
    before = machine_cpu_s(f"cpu  {100 * hz} 0 {50 * hz} {800 * hz} {50 * hz} 0 0 0 0 0\ncpu0 1 2 3\n")
    assert before == (150.0, 1000.0)
    after = machine_cpu_s(f"cpu  {250 * hz} 0 {100 * hz} {850 * hz} {50 * hz} 0 {50 * hz} 0 7 7\n")
    assert after == (400.0, 1300.0)
    assert busy_cores(before, after, cores=2) == 2 * 250 / 300
    assert busy_cores(after, after, cores=2) == 0.0
    busy, total = machine_cpu_s()  # this machine's own
    assert 0 < busy <= total


def test_a_job_start_s_floor_costs_the_machine_cpu_and_leaves_none_of_its_processes(tmp_path):
    pids = tmp_path / "pids"
    cost = floor_job_start_ms(count=10, command=("sh", "-c", f"echo $$ >> {pids}; exec sleep 3600"), settle_s=3.0)
    assert cost > 0
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 10  # every command ran past its gate
    for pid in started:  # each shell's command, stopped with its session (a pid may be another's again)
        try:
            assert Path(f"/proc/{pid}/cmdline").read_bytes() != b"sleep\x003600\x00"
        except FileNotFoundError:
            pass
