"""Whether an operator's ``TenancyUpdated`` may be put in force (pure): who signed it, whether the file is
valid, whether it is newer than the revision in force. Every reason is reported at once."""

from __future__ import annotations

from dataclasses import dataclass

from gpusched_common import events as ev
from gpusched_common.identity import OPERATOR, Verdict

from gpusched_core.quota import Tenancy, TenancyError, load_tenancy


@dataclass(frozen=True)
class Accepted:
    tenancy: Tenancy


@dataclass(frozen=True)
class Rejected:
    problems: tuple[str, ...]
    stale: bool = False  # a valid revision that is not newer than the one in force (ignored, not an error)


def review_update(update: ev.TenancyUpdated, verdict: Verdict | None, in_force: int | None) -> Accepted | Rejected:
    """``verdict``: the credential check of the message (None: this service has no credentials to check
    with, so no update can be trusted). ``in_force``: the revision in force (None: none yet)."""
    if verdict is None:
        return Rejected(("tenancy updates must be signed with an operator credential, and this quota service "
                         "has none to check with (set GPUSCHED_TENANT_KEYS_FILE)",))
    if verdict.tenant is None:
        return Rejected((f"not authenticated: {verdict.reason}",))
    if verdict.tenant != OPERATOR:
        return Rejected((f"a credential of tenant {verdict.tenant!r} may not change the tenancy; "
                         "only an operator credential (tenant '*') may",))
    try:
        tenancy = load_tenancy(update.document)
    except TenancyError as exc:
        return Rejected(exc.problems)
    if tenancy.revision != update.revision:
        return Rejected((f"the update says revision {update.revision} but its document says {tenancy.revision}",))
    if in_force is not None and tenancy.revision <= in_force:
        return Rejected((f"revision {tenancy.revision} is not newer than revision {in_force} in force",), stale=True)
    return Accepted(tenancy)
