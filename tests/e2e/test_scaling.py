"""The scale scenario on the local stack: a burst for a GPU model with no free capacity gives exactly one
scale-out with the right node count; once the burst drains, idle nodes get scale-in decisions after the
cooldown, and no decision flaps."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from gpusched_common import signing
from gpusched_common.db import connect
from gpusched_common.topics import CLUSTER_SCALING
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.integration.kafka_helpers import read_topic

COOLDOWN_S = 5
STACK_ENV = {
    "GPUSCHED_SCALE_OUT_WINDOW_S": "2", "GPUSCHED_SCALE_OUT_CLEAR_S": "1",
    "GPUSCHED_SCALE_OUT_COOLDOWN_S": str(COOLDOWN_S), "GPUSCHED_SCALE_IN_IDLE_S": "3",
    "GPUSCHED_SCALE_IN_COOLDOWN_S": str(COOLDOWN_S),
}


async def decisions(database_url: str) -> list[dict]:
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT direction, gpu_model, node_id, nodes, decided_at, evidence"
                                " FROM scale_decisions ORDER BY decided_at, id")
        return [dict(r) for r in rows]
    finally:
        await conn.close()


async def test_a_burst_scales_out_once_then_idle_nodes_scale_in_without_flapping(local_stack, stack_settings):
    burst = [a_job("x").tenant("research").gpus(8).model("A100-80GB").command("sleep", "4").spec()
             for _ in range(3)]
    async with Client(stack_settings) as client:
        ids = [await client.submit(spec) for spec in burst]
    await wait_until_finished(local_stack.database_url, ids, timeout_s=90, interval_s=0.5)

    deadline = asyncio.get_running_loop().time() + 30
    while True:  # wait for the A100 node to be scaled in after it drained
        made = await decisions(local_stack.database_url)
        if any(d["direction"] == "in" and d["gpu_model"] == "A100-80GB" for d in made):
            break
        assert asyncio.get_running_loop().time() < deadline, made
        await asyncio.sleep(0.5)

    outs = [d for d in made if d["direction"] == "out"]
    assert len(outs) == 1, outs
    out = outs[0]
    assert out["gpu_model"] == "A100-80GB"
    evidence = out["evidence"]
    assert out["nodes"] == math.ceil(evidence["unplaceable_gpus"] / evidence["gpus_per_node"]) >= 1

    ins = [d for d in made if d["direction"] == "in"]
    assert sorted(d["node_id"] for d in ins) == sorted({d["node_id"] for d in ins}), "a node scaled in twice"
    a100_in = next(d for d in ins if d["gpu_model"] == "A100-80GB")
    assert a100_in["node_id"] == "node-2"
    assert (a100_in["decided_at"] - out["decided_at"]).total_seconds() >= COOLDOWN_S
    assert not [d for d in made if d["direction"] == "out" and d["decided_at"] > a100_in["decided_at"]]

    # on the bus, every decision is signed by metrics' own key, which an autoscaler checks it against
    published = await read_topic(local_stack.kafka_bootstrap, CLUSTER_SCALING.name, expect=len(made))
    key = signing.load_key(Path(local_stack.env["GPUSCHED_SERVICE_KEYS_DIR"]) / "metrics.key")
    trusted = signing.TrustedKeys.parse([signing.trusted_entry(key, "metrics")])
    assert published and all(trusted.check(CLUSTER_SCALING.name, r.value, {k: v.decode() for k, v in r.headers})
                             is None for r in published)
