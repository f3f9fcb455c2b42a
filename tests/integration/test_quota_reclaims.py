"""The live quota service on the real broker and PostgreSQL asks the preemption service to reclaim
borrowed quota: a tenant under its nominal quota, blocked because another tenant borrows its share, causes
exactly one ReclaimRequested on gpusched.quota.reclaims, however many cycles run while it waits."""

from __future__ import annotations

import asyncio
import json

from gpusched_common.db import connect
from gpusched_common.runtime import running
from gpusched_common.topics import QUOTA_RECLAIMS
from services.quota.app import quota_setup
from services.quota.settings import QuotaSettings
from tests.integration.kafka_helpers import read_topic
from tests.integration.quota_helpers import admit, wait_for_event

TENANTS = """
version: 1
revision: 1
flavors: [A100-80GB]
tenants:
  - name: org
    children:
      - name: team-a
        quota: {A100-80GB: {nominal: 4}}
      - name: team-b
        quota: {A100-80GB: {nominal: 4}}
"""


async def test_a_tenant_blocked_by_a_borrower_under_its_nominal_quota_causes_exactly_one_reclaim(settings, tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    quota = QuotaSettings.of(settings, tenants_file=tenants, reconcile_interval_s=0.2,
                             quota_reclaim_cooldown_s=600.0)
    async with running("quota", quota, quota_setup(quota)):
        await admit(settings, "b1", "team-b", 8)  # all 8 GPUs of the cohort: 4 borrowed from idle team-a
        await wait_for_event(settings.database_url, "b1", "QuotaReserved")
        await admit(settings, "a1", "team-a", 2)
        deferred = await wait_for_event(settings.database_url, "a1", "QuotaDeferred")
        records = await read_topic(settings.kafka_bootstrap, QUOTA_RECLAIMS.name, expect=1)
        await asyncio.sleep(2.0)  # about ten more reconciliation cycles while a1 still waits
    records = await read_topic(settings.kafka_bootstrap, QUOTA_RECLAIMS.name, expect=2, timeout_s=2.0)

    assert deferred["reason"] == ("tenant team-a under quota (0/4 A100-80GB) while others borrow its share; "
                                  "reclaim requested")
    assert len(records) == 1
    assert records[0].key == b"team-a"
    envelope = json.loads(records[0].value)
    assert (envelope["type"], envelope["producer"], envelope["tenant"]) == ("ReclaimRequested", "quota", "team-a")
    request = envelope["payload"]
    assert (request["tenant"], request["cohort"], request["flavor"], request["gpus"], request["for_jobs"]) == (
        "team-a", "org", "A100-80GB", 2.0, ["a1"])
    assert request["borrowers"] == [{"tenant": "team-b", "borrowed_gpus": 4.0}]
    assert request["reason"] == ("tenant team-a holds 0 of its nominal 4 A100-80GB while team-b borrows 4: "
                                 "reclaim 2 for 1 waiting job")
    conn = await connect(settings.database_url)
    try:  # recorded beside the outbox row, in the cycle's transaction
        assert await conn.fetchval("SELECT count(*) FROM quota_reclaims") == 1
        assert await conn.fetchval("SELECT event_id::text FROM quota_reclaims") == envelope["event_id"]
    finally:
        await conn.close()


async def test_a_reclaim_still_needed_is_asked_for_again_after_the_cooldown(settings, tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    quota = QuotaSettings.of(settings, tenants_file=tenants, reconcile_interval_s=0.2,
                             quota_reclaim_cooldown_s=1.0)
    async with running("quota", quota, quota_setup(quota)):
        await admit(settings, "b1", "team-b", 8)
        await wait_for_event(settings.database_url, "b1", "QuotaReserved")
        await admit(settings, "a1", "team-a", 2)
        records = await read_topic(settings.kafka_bootstrap, QUOTA_RECLAIMS.name, expect=2, timeout_s=10.0)
    assert 2 <= len(records) <= 4  # once, then about once a second while it is still needed
    assert {json.loads(r.value)["payload"]["for_jobs"][0] for r in records} == {"a1"}
