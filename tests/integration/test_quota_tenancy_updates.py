"""Run-time tenancy changes on the real broker and PostgreSQL: an operator's signed TenancyUpdated is put in
force and used from then on, also after a restart with an older file; a forged, invalid or stale update is
rejected with its reasons and an unreadable message is dead-lettered, without stopping the service."""

from __future__ import annotations


from gpusched_common.credentials import TenantKey, new_secret, signed_headers, write_keys
from gpusched_common.identity import OPERATOR
from gpusched_common.db import connect
from gpusched_common.messaging import build_broker, publish
from gpusched_common.runtime import running
from gpusched_common.topics import DEADLETTER, TENANCY_UPDATES
from gpusched_cli.tenants import TENANCY_KEY, publish_tenancy, update_message, wait_for_outcome
from services.quota.app import quota_setup
from services.quota.settings import QuotaSettings
from tests.builders import T0
from tests.integration.kafka_helpers import read_topic
from tests.integration.quota_helpers import admit, wait_for_event


def tenancy(revision: int, team_a_gpus: int) -> str:
    return f"""
version: 1
revision: {revision}
flavors: [A100-80GB]
tenants:
  - name: org
    children:
      - name: team-a
        quota: {{A100-80GB: {{nominal: {team_a_gpus}, borrowing_limit: 0}}}}
      - name: team-b
        quota: {{A100-80GB: {{nominal: 4}}}}
"""


async def send(settings, value: bytes, key: TenantKey | None = None) -> None:
    broker = build_broker(settings, client_id="test")
    await broker.connect()
    try:
        await publish(broker, TENANCY_UPDATES.name, TENANCY_KEY, value, signed_headers(key, value) if key else {})
    finally:
        await broker.stop()


async def test_an_operator_changes_the_tenancy_at_run_time_and_the_change_outlives_a_restart(settings, tmp_path):
    team_a_key = TenantKey("team-a-key", "team-a", new_secret().encode())
    operator_key = TenantKey("operator", OPERATOR, new_secret().encode())
    write_keys(tmp_path / "keys.yaml", [operator_key, team_a_key])
    (tmp_path / "tenants.yaml").write_text(tenancy(1, 1))
    quota = QuotaSettings.of(settings, tenants_file=tmp_path / "tenants.yaml",
                             tenant_keys_file=tmp_path / "keys.yaml")
    async with running("quota", quota, quota_setup(quota)):
        await admit(settings, "a1", "team-a", 2)
        never = await wait_for_event(settings.database_url, "a1", "QuotaDeferred")

        forged_id, forged = update_message(tenancy(2, 2), 2, "test", T0)
        await send(settings, forged, team_a_key)  # a tenant's own key may not change the tenancy
        await send(settings, b"\x00 not an event")
        invalid_id, invalid = update_message(tenancy(2, 2).replace("nominal: 4", "nominal: -4"), 2, "bad", T0)
        await send(settings, invalid, operator_key)  # `gpusched tenants apply` would refuse to publish it
        applied_id = await publish_tenancy(quota, tenancy(2, 2), "good")
        stale_id = await publish_tenancy(quota, tenancy(2, 3), "stale")
        outcomes = [await wait_for_outcome(settings.database_url, i, 20.0)
                    for i in (forged_id, invalid_id, applied_id, stale_id)]
        reserved = await wait_for_event(settings.database_url, "a1", "QuotaReserved")
    dead = await read_topic(settings.kafka_bootstrap, DEADLETTER.name, expect=1)

    assert never["reason"] == ("job needs 2 A100-80GB but tenant team-a can never hold more than 1 "
                               "(nominal 1 + borrowing 0)")
    forged_outcome, invalid_outcome, applied_outcome, stale_outcome = outcomes
    assert forged_outcome == ("rejected", ["a credential of tenant 'team-a' may not change the tenancy; "
                                           "only an operator credential (tenant '*') may"])
    assert invalid_outcome[0] == "rejected" and "greater than or equal to 0" in invalid_outcome[1][0]
    assert applied_outcome == ("applied", [])
    assert stale_outcome == ("rejected", ["revision 2 is not newer than revision 2 in force"])
    assert reserved["tenant_cap_gpus"] == 2  # the waiting job fits revision 2 at once
    assert [r.value for r in dead] == [b"\x00 not an event"]

    # a restart with the older file keeps the newer revision the operator published
    async with running("quota", quota, quota_setup(quota)):
        await admit(settings, "a2", "team-a", 1)
        later = await wait_for_event(settings.database_url, "a2", "QuotaDeferred")
    assert later["reason"] == "tenant team-a at its limit (2/2 A100-80GB + borrowing 0); job needs 1"
    conn = await connect(settings.database_url)
    try:
        assert [tuple(r) for r in await conn.fetch(
            "SELECT revision, source FROM quota_tenancy_revisions ORDER BY revision")] == [
            (1, f"file {tmp_path / 'tenants.yaml'}"), (2, "good")]
    finally:
        await conn.close()
