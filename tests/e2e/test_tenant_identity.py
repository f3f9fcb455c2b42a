"""Tenant identity comes from credentials: a forged or missing credential is counted and creates nothing; a
credential of another tenant is rejected with the reason and counted; a repeated client request creates one job."""

from __future__ import annotations

import asyncio
import json

from gpusched_common.credentials import KEY_ID_HEADER, SIGNATURE_HEADER, load_keys, sign
from gpusched_common.db import connect
from gpusched_cli.client import Client, submission_bytes
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_pipeline import job_view


async def test_forged_missing_and_mismatched_credentials_are_rejected_and_counted(local_stack, stack_settings):
    keys = load_keys(stack_settings.tenant_keys_file)
    research = keys["research-local"]
    spec = a_job("x").tenant("research").spec()
    forged = submission_bytes(spec, "forged-1")
    missing = submission_bytes(spec, "missing-1")
    # signed with the research key but claiming another tenant
    mismatched = submission_bytes(a_job("x").tenant("inference").spec(), "mismatch-1")
    async with Client(stack_settings) as client:
        await client.submit_raw("forged-1", forged, {KEY_ID_HEADER: research.key_id,
                                                     SIGNATURE_HEADER: sign(b"not-the-secret-at-all", forged)})
        await client.submit_raw("missing-1", missing)
        await client.submit_raw("mismatch-1", mismatched, {KEY_ID_HEADER: research.key_id,
                                                           SIGNATURE_HEADER: sign(research.secret, mismatched)})
        own = await client.submit(spec)  # research's own key
        on_behalf = await client.submit(a_job("x").tenant("someone-new").spec())  # the operator key
        # the operator key naming a tenant's user as the submitter: it is recorded as itself all the same
        impostor = submission_bytes(spec, "impostor-1", submitted_by="user:research:alice")
        await client.submit_raw("impostor-1", impostor, sign_as="*")
    ids = ["mismatch-1", own, on_behalf, "impostor-1"]  # the forged and the unsigned one never become jobs
    await wait_until_finished(local_stack.database_url, ids, timeout_s=60, interval_s=0.2)
    views = {i: await job_view(local_stack.database_url, i) for i in ids}
    assert views["mismatch-1"]["reasons"] == ["tenant 'inference' does not match the credential's tenant 'research'"]
    assert views[own]["status"] == "Succeeded"
    assert views[on_behalf]["status"] == "Succeeded"
    assert views[on_behalf]["events"][0]["payload"]["submitted_by"] == "operator-local"
    assert views["impostor-1"]["events"][0]["payload"]["submitted_by"] == "operator-local"  # never alice
    conn = await connect(local_stack.database_url)
    try:
        # not authenticated: counted, and no stream, no job, no inbox row (a forger cannot fill the store)
        assert not await conn.fetchval("SELECT count(*) FROM events WHERE stream_id IN ('job-forged-1', 'job-missing-1')")
        counts = {(r["kind"], r["credential"]): r["failures"] for r in await conn.fetch(
            "SELECT kind, credential, failures FROM admission_auth_failure_counts")}
        forged_kind = (f"credential {research.key_id!r} does not verify: the signature does not match the submission",
                       research.key_id)
        assert counts[forged_kind] == 1 and counts[("missing credential", "-")] >= 1
        assert counts[("tenant 'inference' does not match the credential's tenant 'research'", research.key_id)] == 1
        stored = json.dumps([dict(r) for r in await conn.fetch("SELECT payload FROM events")], default=str)
        assert research.secret.decode() not in stored  # secrets never reach the event store
    finally:
        await conn.close()


async def test_a_repeated_request_creates_one_job(local_stack, stack_settings):
    spec = a_job("x").tenant("research").spec()
    async with Client(stack_settings) as client:
        first = await client.submit(spec, request_id="train-42")
        again = await client.submit(spec, request_id="train-42")
        # a client that ignores the convention and names a new job id for the same request
        other = await client.submit(spec, job_id="j-same-request-new-id", request_id="train-42")
    assert first == again
    await wait_until_finished(local_stack.database_url, [first], timeout_s=60, interval_s=0.2)
    conn = await connect(local_stack.database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'JobSubmitted'",
                                   f"job-{first}") == 1
        assert await conn.fetchval("SELECT count(*) FROM events WHERE stream_id = $1", f"job-{other}") == 0
    finally:
        await conn.close()


async def test_the_queue_shows_each_waiting_job_with_its_position_and_reason(local_stack, stack_settings):
    from gpusched_cli.queries import queue

    # platform may hold at most half of each model (the local tenancy, libs/cli/gpusched_cli/stack.py): of two 4-GPU
    # jobs on the stack's 8 A100s, one waits for quota (which one depends on the order their events arrive
    # from different partitions)
    spec = a_job("x").tenant("platform").gpus(4).model("A100-80GB").command("sleep", "8").spec()
    async with Client(stack_settings) as client:
        jobs = [await client.submit(spec), await client.submit(spec)]
    conn = await connect(local_stack.database_url)
    try:
        entry = None
        for _ in range(100):
            waiting = [w for w in await queue(conn, tenant="platform") if w["job_id"] in jobs]
            entry = next((w for w in waiting if w["waiting_for"] == "quota" and w["reason"].startswith("tenant")),
                         None)
            if entry is not None:
                break
            await asyncio.sleep(0.1)
        assert entry is not None, waiting
        assert entry["reason"] == "tenant platform at its limit (4/2 A100-80GB + borrowing 2); job needs 4"
        assert entry["queue"] == "quota/local" and entry["position"] >= 1
    finally:
        await conn.close()
    await wait_until_finished(local_stack.database_url, jobs, timeout_s=60, interval_s=0.3)
