"""``gpusched.Client``: the gateway's HTTP API for programs (what the ``gpusched`` command uses too).

    from gpusched import Client

    with Client("https://gpusched.example", token) as c:      # or Client.from_config()
        job = c.submit({"tenant": "research", "gpus": 2, "command": ["python", "train.py"]},
                       idempotency_key="nightly-2026-12-01")
        for event in c.events(job["job_id"], follow=True):  # until the job ends
            print(event["type"])
        c.submit({"gpus": 1, "image": "registry.example/team/train:1.2", "args": ["--epochs", "3"],
                  "node_selector": {"zone": "us-east-1a"}, "priority_class": "high"})
        c.submit_workloads(Path("jobs.yaml").read_text())  # every job of a Kubernetes file

Every refusal raises ``ApiError`` with the problem detail the gateway sent (``status``, ``detail``,
``reasons``); a gateway that cannot be reached raises ``ApiError`` with status 0. A workload file that
cannot be read here raises ``WorkloadError`` (a ValueError: ``problems``, one line each).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from pydantic import BaseModel

from gpusched_core.workloads import UNBOUND_TENANT, Workload, WorkloadError, read_workloads
from gpusched_core.workloads.yamlread import YamlProblem, documents

from gpusched.config import ClientConfig, resolve

DEFAULT_TIMEOUT_S = 30.0


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: str, problem: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.problem = status, detail, problem or {}

    @property
    def reasons(self) -> list[str]:
        return list(self.problem.get("reasons") or [])


class Client:
    def __init__(self, server: str, token: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout_s, transport=transport)

    @classmethod
    def from_config(cls, config: ClientConfig | None = None, **kw: Any) -> Client:
        config = config or resolve()
        return cls(config.server, config.token, **kw)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- submissions ---

    def submit(self, spec: dict[str, Any] | BaseModel, *, idempotency_key: str | None = None, hold: bool = False,
               array: str | None = None) -> dict[str, Any]:
        """Submit one JobSpec: a dict (``tenant`` may be omitted by a caller bound to one) or a
        ``gpusched_common.events.JobSpec``, with any of its fields: ``command``, or ``image`` (an empty
        command runs the image's entrypoint, with ``args``), ``node_selector`` (labels every node must
        carry), ``priority_class`` (a tenancy class by name; admission refuses one it does not have)...
        ``hold``: held; ``array``: a job array (``0-99%8``), one job per index, the answer naming the array."""
        body = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, BaseModel) else spec
        return self._call("POST", "/v1/jobs", json=body, headers=_idempotency(idempotency_key),
                          params=_submit_params(hold, array))

    def check(self, spec: dict[str, Any] | BaseModel | str) -> dict[str, Any]:
        """Would this job start now, after preempting lower-priority work, wait, or never run here? Judged
        against the live cluster (``POST /v1/jobs:check``); nothing is submitted. ``spec``: a JobSpec (a
        dict or a ``JobSpec``) or one workload's YAML text. The answer: ``verdict`` (``start``, ``preempt``,
        ``wait``, ``never``), ``summary``, ``reasons``, ``stages``, ``placement``, ``victims``."""
        if isinstance(spec, str):
            return self._call("POST", "/v1/jobs:check", content=spec.encode(),
                              headers={"Content-Type": "application/yaml"})
        body = spec.model_dump(mode="json", exclude_none=True) if isinstance(spec, BaseModel) else spec
        return self._call("POST", "/v1/jobs:check", json=body)

    def submit_pod(self, pod_yaml: str, *, idempotency_key: str | None = None, hold: bool = False,
                   array: str | None = None) -> dict[str, Any]:
        """Submit one workload as YAML text (a pod spec, a Pod, a Job, a PyTorchJob, a JobSet); the gateway
        reads it. A file of several documents is refused here (``WorkloadError``), as the gateway would:
        ``submit_workloads`` (like ``gpusched submit -f``) sends each of its jobs."""
        try:
            count = sum(1 for _ in documents(pod_yaml))
        except YamlProblem:
            count = 1  # unreadable: the gateway says why, with the line
        if count > 1:
            raise WorkloadError([f"the YAML has {count} documents: submit_pod sends one workload; "
                                 "submit_workloads (or `gpusched submit -f`) sends each"])
        return self._call("POST", "/v1/jobs", content=pod_yaml.encode(), params=_submit_params(hold, array),
                          headers={"Content-Type": "application/yaml", **_idempotency(idempotency_key)})

    def submit_workloads(self, text: str | bytes, *, tenant: str | None = None, idempotency_key: str | None = None,
                         hold: bool = False) -> list[dict[str, Any]]:
        """Submit every job of a workload file (YAML of one or more documents), as ``gpusched submit -f``
        does: read here by ``gpusched_core.workloads.read_workloads`` (``WorkloadError`` with every problem,
        nothing sent), then each job sent in order as its JobSpec, with its array; ``tenant`` overrides the
        file's ``metadata.namespace`` (neither: the caller's). With several jobs the key of job ``i`` is
        ``<idempotency_key>.<i>``. A refusal (``ApiError``) stops the rest; submitting again with the same
        key replays those that went. The gateway's answers, in order."""
        workloads = read_workloads(text, tenant=tenant, tenant_required=False)
        answers = []
        for index, workload in enumerate(workloads):
            key = idempotency_key if idempotency_key is None or len(workloads) == 1 else f"{idempotency_key}.{index}"
            answers.append(self.submit(job_body(workload), idempotency_key=key, hold=hold, array=workload.array))
        return answers

    def submit_batch(self, specs: list[dict[str, Any]], *, idempotency_key: str | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs:batch", json={"jobs": specs}, headers=_idempotency(idempotency_key))

    def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel a job: ``cancel`` is ``requested`` (it ends Cancelled once stopped), or says it had ended."""
        return self._call("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": reason} if reason else None)

    def hold(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/hold", json={"reason": reason} if reason else None)

    def release(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/release")

    def cordon(self, node_id: str, reason: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/v1/nodes/{node_id}/cordon", json={"reason": reason} if reason else None)

    def drain(self, node_id: str, reason: str | None = None, grace_s: float = 600.0) -> dict[str, Any]:
        return self._call("POST", f"/v1/nodes/{node_id}/drain",
                          json={"grace_s": grace_s, **({"reason": reason} if reason else {})})

    def uncordon(self, node_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/nodes/{node_id}/uncordon")

    # --- reads ---

    def jobs(self, **filters: Any) -> dict[str, Any]:
        """One page: ``{"jobs": [...], "next": cursor}``; filters: state, tenant, name, since, until, array,
        limit, cursor."""
        return self._call("GET", "/v1/jobs", params={k: v for k, v in filters.items() if v is not None})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def events(self, job_id: str, *, follow: bool = False, after: int = 0) -> Iterator[dict[str, Any]]:
        """The job's events in order; ``follow``: as they happen, until the job's last one."""
        if not follow:
            yield from self._call("GET", f"/v1/jobs/{job_id}/events", params={"after": after})["events"]
            return
        with self._http.stream("GET", f"/v1/jobs/{job_id}/events", params={"follow": "true", "after": after},
                               timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=None)) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            for data in _sse_data(response.iter_lines()):
                yield json.loads(data)

    def logs(self, job_id: str, *, rank: int = 0) -> tuple[bytes, int]:
        """All of the job's output so far (from its ``rank``'s node), and the offset it ended at."""
        parts, offset = [], 0
        while True:
            try:
                response = self._http.get(f"/v1/jobs/{job_id}/logs", params={"rank": rank, "offset": offset})
            except httpx.HTTPError as exc:
                raise ApiError(0, f"the gateway at {self.server} is not reachable ({type(exc).__name__})") from None
            if response.status_code >= 400:
                raise _error(response)
            parts.append(response.content)
            following = int(response.headers.get("x-log-next-offset", offset))
            if not response.content or following == offset:
                return b"".join(parts), offset
            offset = following

    def follow_logs(self, job_id: str, *, rank: int = 0, offset: int = 0) -> Iterator[bytes]:
        """The job's output as it is written, from ``offset``, until the job has ended."""
        with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"rank": rank, "offset": offset,
                                                                          "follow": "true"},
                               timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=None)) as response:
            if response.status_code >= 400:
                response.read()
                raise _error(response)
            yield from response.iter_bytes()

    def queue(self, tenant: str | None = None) -> dict[str, Any]:
        return self._call("GET", "/v1/queue", params={"tenant": tenant} if tenant else None)

    def queue_estimates(self, tenant: str | None = None) -> dict[str, Any]:
        """When each waiting job should start: ``{"tenant", "as_of", "jobs": [...]}``."""
        return self._call("GET", "/v1/queue/estimates", params={"tenant": tenant} if tenant else None)

    def tenants(self, tenant: str | None = None) -> dict[str, Any]:
        return self._call("GET", "/v1/tenants", params={"tenant": tenant} if tenant else None)

    def nodes(self) -> dict[str, Any]:
        return self._call("GET", "/v1/nodes")

    def ready(self) -> dict[str, Any]:
        return self._call("GET", "/readyz")

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"the gateway at {self.server} is not reachable ({type(exc).__name__}: {exc})") from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json()


def job_body(workload: Workload) -> dict[str, Any]:
    """A workload's JobSpec as the gateway takes it: its array apart (a request parameter), no tenant when
    the file names none (the caller's then)."""
    body = workload.spec.model_dump(mode="json", exclude_none=True)
    body.pop("array", None)
    if body.get("tenant") == UNBOUND_TENANT:
        del body["tenant"]
    return body


def _submit_params(hold: bool, array: str | None) -> dict[str, str] | None:
    params = {**({"hold": "true"} if hold else {}), **({"array": array} if array is not None else {})}
    return params or None


def _idempotency(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


def _error(response: httpx.Response) -> ApiError:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    detail = problem.get("detail") or response.reason_phrase or f"HTTP {response.status_code}"
    return ApiError(response.status_code, str(detail), problem)


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each server-sent event (comments and other fields skipped)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)
