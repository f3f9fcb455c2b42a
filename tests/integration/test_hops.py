"""bench-scale's hop-by-hop breakdown (`gpusched_cli.hops`) read from a real event store: each hop between the marks
a job leaves in PostgreSQL, the first StartJob's publication among its re-sends, and the relays' delays."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

from gpusched_cli.hops import HOPS, hops_of, job_hops, quantiles, relay_delays, stage_progress, turnover_of
from gpusched_common.db import connect

T0 = datetime(2026, 12, 7, 6, 0, tzinfo=timezone.utc)


def at(ms: float) -> datetime:
    return T0 + timedelta(milliseconds=ms)


async def _job(conn, job_id: str, marks_ms: dict[str, float]) -> None:  # noqa: ANN001 - an asyncpg connection
    await conn.execute("INSERT INTO jobs (job_id, status, version, submitted_at, started_at, updated_at)"
                       " VALUES ($1, 'Running', 4, $2, $3, $3)", job_id, at(0), at(marks_ms["started"]))
    for version, (kind, mark) in enumerate((("JobAdmitted", "admitted"), ("QuotaReserved", "reserved"),
                                            ("JobPlaced", "placed"), ("JobStarted", "started")), start=1):
        payload = {"started_at": at(marks_ms["start_began"]).isoformat()} if kind == "JobStarted" else {}
        await conn.execute(
            "INSERT INTO events (stream_id, version, event_id, type, schema_version, occurred_at, recorded_at, producer,"
            " payload) VALUES ($1, $2, $3, $4, 1, $5, $5, 'test', $6::jsonb)",
            f"job-{job_id}", version, uuid.uuid4(), kind, at(marks_ms[mark]), payload)  # the pool's json codec
    for published in (marks_ms["command_published"], marks_ms["command_published"] + 5000):  # a re-send, later
        value = json.dumps({"type": "StartJob", "payload": {"job_id": job_id}}).encode()
        await conn.execute(
            "INSERT INTO outbox (producer, topic, key, headers, value, created_at, published_at) VALUES"
            " ('placement', 'gpusched.nodes.commands', 'node-1', $1::jsonb, $2, $3, $4)",
            {"event-type": "StartJob"}, value, at(published - 20), at(published))


async def test_each_hop_is_read_between_the_marks_a_job_left_in_the_store(database_url):
    conn = await connect(database_url)
    try:
        await _job(conn, "j1", {"admitted": 10, "reserved": 60, "placed": 110, "command_published": 130,
                                "start_began": 170, "started": 215})
        await _job(conn, "j2", {"admitted": 20, "reserved": 40, "placed": 100, "command_published": 125,
                                "start_began": 160, "started": 200})
        await _job(conn, "other", {"admitted": 1, "reserved": 2, "placed": 3, "command_published": 4,
                                   "start_began": 5, "started": 6})
        hops = await job_hops(conn, ["j1", "j2"])
        assert list(hops) == [name for name, _, _ in HOPS]
        assert hops["submitted -> admitted"] == {"p50": 10.0, "p90": 20.0, "p99": 20.0, "n": 2}
        assert hops["admitted -> reserved"]["p50"] == 20.0 and hops["admitted -> reserved"]["p99"] == 50.0
        assert hops["placed -> StartJob published"] == {"p50": 20.0, "p90": 25.0, "p99": 25.0, "n": 2}  # the first
        assert hops["StartJob published -> agent starts it"]["p50"] == 35.0
        assert hops["agent starts it -> started recorded"] == {"p50": 40.0, "p90": 45.0, "p99": 45.0, "n": 2}
        relays = await relay_delays(conn, ["j1", "j2"])
        # the rows written from the first submission to the last start: j1's and j2's first StartJobs (20 ms
        # each); the other job's, written before, and the re-sends, written after, are left out
        assert relays == {"placement": {"p50": 20.0, "p90": 20.0, "p99": 20.0, "n": 2}}
    finally:
        await conn.close()


def test_quantiles_are_nearest_rank_and_a_hop_without_both_marks_is_left_out():
    assert quantiles([]) is None
    assert quantiles([5.0, 1.0, 3.0, 2.0, 4.0]) == {"p50": 3.0, "p90": 5.0, "p99": 5.0, "n": 5}
    marks = [{"submitted": at(0), "admitted": at(12.34)}, {"submitted": at(0), "admitted": None}]
    hops = hops_of(marks)
    assert hops["submitted -> admitted"] == {"p50": 12.3, "p90": 12.3, "p99": 12.3, "n": 1}
    assert hops["admitted -> reserved"] is None


def test_a_burst_s_stages_say_when_each_share_of_jobs_got_there_and_the_slowest_stage_s_pace():
    # ten jobs submitted at 0 ms; admitted one every 10 ms, placed one every 100 ms; one never placed
    marks = [{"submitted": at(0), "admitted": at(10.0 * (i + 1)), "placed": at(100.0 * (i + 1)) if i < 9 else None}
             for i in range(10)]
    stages = stage_progress(marks)
    assert stages["admitted"] == {"t10_s": 0.01, "t50_s": 0.05, "t90_s": 0.09, "t100_s": 0.1, "n": 10,
                                  "per_s": 100.0}
    # nearest rank over the nine placed: 10% is the 1st, 50% the 5th, 90% the 9th
    assert stages["placed"] == {"t10_s": 0.1, "t50_s": 0.5, "t90_s": 0.9, "t100_s": 0.9, "n": 9, "per_s": 9.0}
    assert stages["reserved"] is None and stages["started"] is None
    assert stage_progress([]) == {}


def test_a_gpu_s_turnover_is_split_at_the_exit_recorded_and_a_job_reserved_ahead_waits_for_the_gpu_not_quota():
    marks = {
        # reserved long before the previous run ended: its wait for quota is none of the gap
        "ahead": {"reserved": at(-5000), "placed": at(130), "command_published": at(150), "start_began": at(170)},
        # reserved only after the exit was recorded (quota had to release first)
        "after": {"reserved": at(160), "placed": at(180), "command_published": at(200), "start_began": at(230)},
    }
    gaps = [(at(0), at(100), "ahead"), (at(0), at(120), "after"), (at(0), at(50), "not-in-the-store")]
    hops = turnover_of(gaps, marks)
    assert hops["exit -> exit recorded"]["n"] == 2  # the job the store does not know is left out
    assert sorted([hops["exit -> exit recorded"]["p50"], hops["exit -> exit recorded"]["p99"]]) == [100.0, 120.0]
    assert hops["exit recorded -> next reserved"] == {"p50": 0.0, "p90": 40.0, "p99": 40.0, "n": 2}
    assert hops["next reserved -> placed"] == {"p50": 20.0, "p90": 30.0, "p99": 30.0, "n": 2}
    assert hops["StartJob published -> agent starts it"] == {"p50": 20.0, "p90": 30.0, "p99": 30.0, "n": 2}
