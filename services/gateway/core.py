"""The gateway's own decisions (pure): the shape of its error bodies (RFC 9457 problem details), its
opaque pagination cursors, what of a waiting job a principal may see in the queue, and how a request body
becomes a job (JSON JobSpec or YAML pod spec; job ids from Idempotency-Keys). Who may do what is
not decided here but in ``gpusched_core.access``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.ids import is_valid_id, job_id_for_request

from gpusched_core.podspec import PodSpecError, one_workload
from gpusched_core.workloads import named_namespace
from gpusched_core.submission import error_reasons

PROBLEM_TYPE = "application/problem+json"
# status: (the type's slug, the title); other statuses are "error"
_KINDS = {400: ("invalid-request", "Bad Request"), 401: ("unauthenticated", "Unauthorized"),
          403: ("forbidden", "Forbidden"), 404: ("not-found", "Not Found"),
          405: ("method-not-allowed", "Method Not Allowed"), 409: ("conflict", "Conflict"), 413: ("request-too-large", "Content Too Large"),
          415: ("unsupported-media-type", "Unsupported Media Type"), 422: ("invalid-request", "Unprocessable Content"),
          429: ("rate-limited", "Too Many Requests"), 503: ("unavailable", "Service Unavailable"),
          504: ("timeout", "Gateway Timeout")}
QUEUE_ID_FIELDS = ("job_id", "queue", "position")  # all of a waiting job that a role without job reads sees


def problem(status: int, detail: str, title: str | None = None, **extensions: Any) -> dict[str, Any]:
    """An RFC 9457 body: ``type`` names the kind of problem, ``title`` is the status's phrase unless given,
    ``detail`` says what went wrong for this request (never a credential); extension members (``reasons``:
    every reason a job is refused) follow."""
    slug, phrase = _KINDS.get(status, ("error", "Error"))
    return {"type": f"urn:gpusched:problem:{slug}", "title": title or phrase,
            "status": status, "detail": detail, **extensions}


class BadCursor(ValueError):
    """A ``next`` that this gateway did not write."""


def encode_cursor(sort_at: datetime, job_id: str) -> str:
    """Where a page of jobs (newest first by ``(submitted_at, job_id)``) ended, opaque to clients."""
    return json.dumps([sort_at.isoformat(), job_id], separators=(",", ":")).encode().hex()


def decode_cursor(text: str) -> tuple[datetime, str]:
    try:
        sort_at, job_id = json.loads(bytes.fromhex(text))
        parsed = datetime.fromisoformat(sort_at)
    except (ValueError, TypeError) as exc:
        raise BadCursor(f"not a cursor this gateway wrote: {text[:64]!r}") from exc
    if not isinstance(job_id, str) or parsed.tzinfo is None:
        raise BadCursor(f"not a cursor this gateway wrote: {text[:64]!r}")
    return parsed, job_id


def queue_view(entry: dict[str, Any], sees_jobs: bool) -> dict[str, Any]:
    """A waiting job as the principal may see it: everything when it may read those jobs, else only its
    id and where it stands (a viewer reads the queue, but no job: ``gpusched_core.access``)."""
    return dict(entry) if sees_jobs else {k: entry[k] for k in QUEUE_ID_FIELDS}


def borrowed_units(reserved_units: int, nominal_units: int) -> int:
    """What a tenant holds beyond its nominal quota (borrowed from its cohort)."""
    return max(0, reserved_units - nominal_units)


# --- submissions ----------------------------------------------------------------------------------------

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


class BadBody(ValueError):
    """A request body that is no job: ``status`` 400 (unreadable), 415 (a media type not taken) or 422
    (readable, but not a valid job), with every reason."""

    def __init__(self, status: int, reasons: list[str] | tuple[str, ...]) -> None:
        super().__init__("; ".join(reasons))
        self.status, self.reasons = status, tuple(reasons)


def media_type(content_type: str | None) -> str:
    return (content_type or "application/json").split(";")[0].strip().lower()


def job_document(content_type: str | None, body: bytes) -> tuple[str, Any]:
    """("json", the object) or ("yaml", the text) of a job request body."""
    kind = media_type(content_type)
    if kind in YAML_TYPES:
        try:
            return "yaml", body.decode()
        except UnicodeDecodeError:
            raise BadBody(400, ["the YAML body is not UTF-8 text"]) from None
    if kind not in JSON_TYPES:
        raise BadBody(415, [f"a job is sent as application/json (a JobSpec) or application/yaml (a pod spec), "
                            f"not {kind}"])
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadBody(400, [f"the body is not valid JSON: {exc}"]) from None
    if not isinstance(doc, dict):
        raise BadBody(422, ["a job is a JSON object (a JobSpec)"])
    return "json", doc


def named_tenant(kind: str, doc: Any) -> str | None:
    """The tenant a job request names, if any (a JobSpec's ``tenant``, a workload's ``metadata.namespace``);
    the caller's identity decides whether it may (``gpusched_core.access``)."""
    named = doc.get("tenant") if kind == "json" else named_namespace(doc)  # unreadable: build_job says why
    return str(named) if named is not None else None


def build_job(kind: str, doc: Any, tenant: str) -> tuple[ev.JobSpec, str | None, tuple[str, ...]]:
    """(the JobSpec, the array expression its file asks for, the warnings about what it asks for that
    gpusched does not do) of a request for ``tenant`` (the one the access decision gave). YAML is one
    workload (a pod, a Job, a PyTorchJob, a JobSet: ``gpusched_core.workloads``); a file of several is
    refused (``gpusched submit -f`` sends each). BadBody(422) with every reason otherwise."""
    if kind != "yaml":
        return build_spec(kind, doc, tenant), None, ()
    try:
        workload = one_workload(doc, tenant=tenant)
    except PodSpecError as exc:
        raise BadBody(422, exc.problems) from None
    return workload.spec, workload.array, workload.warnings


def build_spec(kind: str, doc: Any, tenant: str) -> ev.JobSpec:
    """The JobSpec of a request for ``tenant`` (the one the access decision gave); BadBody(422) with every
    reason otherwise, in admission's words."""
    if kind == "yaml":
        return build_job(kind, doc, tenant)[0]
    try:
        return ev.JobSpec.model_validate({**doc, "tenant": tenant})
    except ValidationError as exc:
        raise BadBody(422, error_reasons(exc)) from None


def request_ids(tenant: str, idempotency_key: str | None, index: int | None = None) -> tuple[str | None, str | None]:
    """(job id, request id) of a submission: derived from the Idempotency-Key, so a retry names the same
    job (one key per item of a batch: ``<key>.<index>``); (None, None) without a key."""
    if idempotency_key is None:
        return None, None
    request_id = idempotency_key if index is None else f"{idempotency_key}.{index}"
    return job_id_for_request(tenant, request_id), request_id


def valid_idempotency_key(key: str) -> bool:
    return len(key) <= 100 and is_valid_id(key)


# --- server-sent events ---------------------------------------------------------------------------------

LAST_EVENT_TYPES = frozenset({"JobSucceeded", "JobFailed", "JobCancelled", "JobRejected"})  # a job's last


def sse(event: dict[str, Any]) -> bytes:
    """One event of a job's stream as a server-sent event: ``id`` its version, ``event`` its type, ``data``
    the event as JSON on one line."""
    data = json.dumps(event, default=_jsonable, separators=(",", ":"))
    return f"id: {event['version']}\nevent: {event['type']}\ndata: {data}\n\n".encode()


def _jsonable(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def node_state(node: dict[str, Any]) -> str:
    """What an operator sees of a node: Lost, Drained (drained and empty), Draining, Cordoned, or Ready."""
    if node["status"] != "Ready":
        return str(node["status"])
    if node.get("drain_requested_at") is not None:
        return "Drained" if not node.get("allocations") else "Draining"
    return "Cordoned" if node.get("cordoned_at") is not None else "Ready"
