"""Tiny openb-format traces written into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-a,32000,131072,4,T4
node-b,32000,131072,4,T4
node-c,96000,393216,8,G2
node-d,16000,65536,0,
"""

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
POD_ROWS = [
    "pod-{i:03d},4000,8192,1,500,,LS,Running,0,10,0",
    "pod-{i:03d},8000,16384,1,1000,,LS,Running,0,10,0",
    "pod-{i:03d},2000,4096,0,0,,BE,Running,0,10,0",
    "pod-{i:03d},16000,32768,2,1000,T4,LS,Running,0,10,0",
    "pod-{i:03d},3000,4096,1,250,G2|T4,LS,Running,0,10,0",
]

ALLOCATION = """workload,sc_policy,tune,seed,total_gpus,99,100,101
tiny_pods,05-BestFit,1.3,42,16,90.0,91.0,92.0
tiny_pods,05-BestFit,1.3,43,16,90.0,93.0,92.0
tiny_pods,05-BestFit,1.3,44,16,90.0,92.0,92.0
tiny_pods,06-FGD,1.3,42,16,90.0,95.5,92.0
"""


@pytest.fixture
def tiny_trace(tmp_path: Path) -> tuple[Path, Path, Path]:
    nodes = tmp_path / "tiny_nodes.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "tiny_pods.csv"
    rows = [POD_ROWS[i % len(POD_ROWS)].format(i=i) for i in range(30)]
    pods.write_text(POD_HEADER + "\n".join(reversed(rows)) + "\n")
    published = tmp_path / "published"
    published.mkdir()
    (published / "analysis_allo_discrete.csv").write_text(ALLOCATION)
    return nodes, pods, published
