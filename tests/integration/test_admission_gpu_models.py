"""Admission on real PostgreSQL accepts a GPU model only a registered node has (read from placement's
``gpus`` through ``stores.gpu_models``), names it as the cluster does, and refuses a model no node has
with the list of models the cluster has."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from gpusched_common.batching import apply_batch
from gpusched_common.db import create_pool
from gpusched_common.messaging import Incoming
from gpusched_common.stores.gpu_models import ModelReader
from gpusched_common.topics import JOBS_SUBMITTED
from gpusched_core.gpu_models import load_catalogue
from services.admission.core import AdmissionLimits, RateLimit
from services.admission.handlers import AdmissionPolicy, make_submission_handler
from gpusched_cli.client import submission_bytes
from tests.builders import T0, a_job


def now() -> datetime:
    return datetime.now(timezone.utc)


async def test_admission_accepts_the_models_registered_nodes_have_and_lists_them_when_refusing(database_url):
    pool = await create_pool(database_url)
    try:
        await pool.execute("INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend,"
                           " registered_at, last_seen_at) VALUES ('b200-1', 'b200-1', '{}', 64000, 1048576, 'nvml',"
                           " $1, $1)", now())
        await pool.executemany("INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib) VALUES"
                               " ('b200-1', $1, $2, 'B200-180GB', 183359)", [(i, f"GPU-{i}") for i in range(8)])
        catalogue = load_catalogue("models: [{name: B200-180GB, display: NVIDIA B200, aliases: [blackwell]}]")
        policy = AdmissionPolicy(AdmissionLimits(), RateLimit(1000, 1000), keys=None, require_credentials=False)
        handler = make_submission_handler(policy, now, models=ModelReader(catalogue, refresh_s=0.0))
        jobs = {"label": a_job("label").gpus(8).model("NVIDIA-B200"), "alias": a_job("alias").model("blackwell"),
                "share": a_job("share").share(500, 200_000).model("B200-180GB"),
                "gh200": a_job("gh200").model("NVIDIA GH200 480GB")}
        for offset, (job_id, job) in enumerate(jobs.items()):
            await apply_batch(pool, "admission", [Incoming(JOBS_SUBMITTED.name, 0, offset, job_id,
                                                           submission_bytes(job.spec(), job_id, now=T0), {})], handler)
        rows = await pool.fetch("SELECT stream_id, type, payload FROM events WHERE type IN ('JobAdmitted', 'JobRejected')")
        outcome = {r["stream_id"].removeprefix("job-"): (r["type"], json.loads(r["payload"])
                                                         if isinstance(r["payload"], str) else r["payload"]) for r in rows}
        assert outcome["label"][0] == "JobAdmitted" and outcome["label"][1]["spec"]["gpu_model"] == "B200-180GB"
        assert outcome["alias"][0] == "JobAdmitted" and outcome["alias"][1]["spec"]["gpu_model"] == "B200-180GB"
        assert outcome["share"] == ("JobRejected", {"job_id": "share", "tenant": "team-a", "reasons": [
            "gpu_share.memory_mib 200000 is outside 0..183359"]})
        assert outcome["gh200"][1]["reasons"] == ["unknown GPU model 'NVIDIA GH200 480GB': no registered node has "
                                                  "GH200 (the cluster has: B200-180GB (NVIDIA B200))"]
    finally:
        await pool.close()
