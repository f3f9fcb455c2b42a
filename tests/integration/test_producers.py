"""Credentialed producers on real PostgreSQL, through admission's real handler: a producer is admitted for
its own tenants and refused (with the reason, counted in admission_auth_failures) for any other; a bad
signature, an unknown or a revoked producer is refused at once; only a producer that may attest names the
submitter; the key is shown once and the store keeps only the public key."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpusched_cli.client import submission_bytes
from gpusched_common import producers
from gpusched_common.batching import apply_batch
from gpusched_common.db import connect, create_pool
from gpusched_common.identity import OPERATOR
from gpusched_common.messaging import Incoming
from gpusched_common.topics import JOBS_SUBMITTED
from services.admission.core import AdmissionLimits, RateLimit
from services.admission.handlers import AdmissionPolicy, make_submission_handler
from tests.builders import T0, a_job

POLICY = AdmissionPolicy(AdmissionLimits(), RateLimit(1000, 1000), keys=None, require_credentials=True)


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
async def pool(database_url: str):
    pool = await create_pool(database_url)
    yield pool
    await pool.close()


async def make(pool, name: str, tenants: tuple[str, ...], attests: bool = False) -> producers.ProducerKey:
    async with pool.acquire() as conn:
        text, info = await producers.create(conn, name=name, tenants=tenants, attests=attests, created_by="test",
                                            now=T0)
    assert info.tenants == tenants and info.name == name
    key = producers.parse_key(text)
    assert key is not None and key.producer_id == info.producer_id
    return key


async def submit(pool, job_id: str, tenant: str, key: producers.ProducerKey | None, *, attested: str | None = None,
                 tamper: bool = False) -> dict:
    value = submission_bytes(a_job(job_id).tenant(tenant).spec(), job_id, now=T0)
    if attested is not None:
        doc = json.loads(value)
        doc["payload"]["submitted_by"] = attested
        value = json.dumps(doc).encode()
    headers = key.headers(value) if key else {}
    if tamper:  # changed in flight after signing: another tenant's job
        value = value.replace(f'"tenant":"{tenant}"'.encode(), b'"tenant":"zz"')
    handler = make_submission_handler(POLICY, now)
    await apply_batch(pool, "admission", [Incoming(JOBS_SUBMITTED.name, 0, 1, job_id, value, headers)], handler)
    row = await pool.fetchrow("SELECT status, reasons, submitted_by, tenant FROM jobs WHERE job_id = $1", job_id)
    return dict(row) if row is not None else None  # None: not authenticated, so no stream at all


async def failures(pool) -> list[str]:
    """The latest reason of each failure counter, oldest first (one row per kind and credential)."""
    return [r["last_reason"] for r in await pool.fetch(
        "SELECT last_reason FROM admission_auth_failure_counts ORDER BY first_at, kind")]


async def counted(pool) -> dict[str, int]:
    return {r["kind"]: r["failures"] for r in await pool.fetch("SELECT kind, failures FROM admission_auth_failure_counts")}


async def test_a_producer_is_admitted_for_its_tenants_and_refused_for_others(pool):
    key = await make(pool, "research-pipeline", ("a", "b"))
    assert (await submit(pool, "p-1", "a", key))["status"] == "Admitted"
    assert (await submit(pool, "p-2", "b", key))["status"] == "Admitted"
    other = await submit(pool, "p-3", "c", key)
    assert other["status"] == "Rejected"
    assert other["reasons"] == ["producer 'research-pipeline' may not submit for tenant 'c' (its tenants: a, b)"]
    assert await failures(pool) == other["reasons"]
    # who submitted: the producer itself, as it may not attest anyone
    assert (await pool.fetchval("SELECT submitted_by FROM jobs WHERE job_id = 'p-1'")) == "producer:research-pipeline"


async def test_a_revoked_producer_is_refused_at_once(pool):
    key = await make(pool, "ci", ("a",))
    assert (await submit(pool, "r-1", "a", key))["status"] == "Admitted"
    async with pool.acquire() as conn:
        assert await producers.revoke(conn, key.producer_id, now())
        assert not await producers.revoke(conn, key.producer_id, now())  # twice: nothing to revoke
    assert await submit(pool, "r-2", "a", key) is None  # no stream: a revoked key authenticates nobody
    assert await failures(pool) == [f"producer 'ci' ({key.producer_id}) is revoked"]
    assert not await pool.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'admission' AND event_id IN"
                                   " (SELECT event_id::text FROM events WHERE stream_id = 'job-r-2')")


async def test_a_bad_signature_an_unknown_producer_and_no_credential_are_refused(pool):
    key = await make(pool, "ci", ("a",))
    assert await submit(pool, "t-1", "a", key, tamper=True) is None
    assert "the signature does not match" in (await failures(pool))[0]
    async with pool.acquire() as conn:
        text, _ = await producers.create(conn, name="other", tenants=("a",), attests=False, created_by="t", now=T0)
        await conn.execute("DELETE FROM producers WHERE name = 'other'")
    assert await submit(pool, "t-2", "a", producers.parse_key(text)) is None
    assert await submit(pool, "t-3", "a", None) is None
    assert await submit(pool, "t-4", "a", None) is None  # the same kind again: the same counter
    kinds = await counted(pool)
    assert kinds["unknown credential"] == 1 and kinds["missing credential"] == 2 and len(kinds) == 3
    assert not await pool.fetchval("SELECT count(*) FROM events WHERE stream_id LIKE 'job-t-%'")


async def test_only_an_attesting_producer_names_the_submitter(pool):
    gateway = await make(pool, "gateway", (OPERATOR,), attests=True)
    plain = await make(pool, "pipeline", ("a",))
    attested = await submit(pool, "s-1", "a", gateway, attested="token:0123456789abcdef:alice")
    assert attested["status"] == "Admitted" and attested["submitted_by"] == "token:0123456789abcdef:alice"
    claimed = await submit(pool, "s-2", "a", plain, attested="token:0123456789abcdef:alice")
    assert claimed["status"] == "Admitted" and claimed["submitted_by"] == "producer:pipeline"
    events = await pool.fetch("SELECT payload FROM events WHERE stream_id = 'job-s-1' ORDER BY version")
    first = json.loads(events[0]["payload"]) if isinstance(events[0]["payload"], str) else events[0]["payload"]
    assert first["producer"] == gateway.producer_id


async def test_the_store_keeps_no_private_key_and_names_are_unique(database_url):
    conn = await connect(database_url)
    try:
        text, info = await producers.create(conn, name="x", tenants=("a",), attests=False, created_by="t", now=T0)
        stored = await conn.fetchval("SELECT public_key FROM producers WHERE producer_id = $1", info.producer_id)
        assert len(stored) == 32 and text.split("_")[-1] not in stored.hex()
        assert repr(producers.parse_key(text)) == f"ProducerKey(producer_id={info.producer_id!r})"
        with pytest.raises(ValueError, match="exists already"):
            await producers.create(conn, name="x", tenants=("b",), attests=False, created_by="t", now=T0)
        assert [p.name for p in await producers.list_producers(conn)] == ["x"]
    finally:
        await conn.close()


@pytest.mark.parametrize("text", ["", "gsk_", "gsk_0123456789abcdef_short", "gst_0123456789abcdef_" + "A" * 43,
                                  "gsk_0123456789ABCDEF_" + "A" * 43])
def test_malformed_keys_parse_to_none(text):
    assert producers.parse_key(text) is None
