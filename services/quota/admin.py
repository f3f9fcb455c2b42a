"""Quota's Kafka edge for run-time tenancy changes: an operator's ``TenancyUpdated`` in; the revision put in
force (with its limits, and a cycle for every cohort, since waiting work may fit the new quotas), or
rejected with every reason, recorded and logged. A bad update never stops the service."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.credentials import TenantKey, verify
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.store import claim

from services.quota.policy_handlers import SERVICE, CycleOptions, reserve_everywhere
from services.quota.revisions import install, lock_revisions, record_rejection
from services.quota.updates import Accepted, review_update

log = logging.getLogger(__name__)
GROUP_QUOTA_ADMIN = "gpusched-quota-admin"


def make_tenancy_update_handler(keys: dict[str, TenantKey] | None, clock: Callable[[], datetime],
                                options: CycleOptions = CycleOptions()) -> TxHandler:
    """``keys``: the credentials to check signatures with (None: none configured, every update refused)."""

    async def on_update(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, update = parse_event(message)
        if not isinstance(update, ev.TenancyUpdated) or not await claim(conn, SERVICE, envelope.event_id):
            return
        now = clock()
        in_force = await lock_revisions(conn)  # exclusive: no decision runs while the tenancy changes
        verdict = verify(keys, message.headers, message.value) if keys is not None else None
        review = review_update(update, verdict, in_force)
        if not isinstance(review, Accepted):
            await record_rejection(conn, event_id=envelope.event_id, revision=update.revision, source=update.source,
                                   problems=review.problems, now=now)
            (log.info if review.stale else log.warning)(
                "quota: tenancy update %s (revision %d) not applied: %s", envelope.event_id, update.revision,
                "; ".join(review.problems))
            return
        await install(conn, review.tenancy, update.document, source=update.source or "TenancyUpdated",
                      event_id=envelope.event_id, now=now)
        log.info("quota: tenancy revision %d in force (was %s), %d tenants", review.tenancy.revision, in_force,
                 len(review.tenancy.leaves()))
        await reserve_everywhere(conn, review.tenancy, now, options)

    return on_update
