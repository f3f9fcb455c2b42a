"""schemas/asyncapi.yaml, the contract external producers code against, stays true to the code: its
channels are gpusched's topics, its headers are the names admission reads, and every schema file it
points at exists beside it (a renamed topic, header or schema fails here, not in a partner's program)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpusched_common import producers, topics

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
DOC = yaml.safe_load((SCHEMAS / "asyncapi.yaml").read_text())


def refs(node: object) -> Iterator[str]:
    """Every `$ref` value anywhere in the document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve_local(ref: str) -> object:
    """The node a `#/...` pointer names inside the document."""
    assert ref.startswith("#/"), ref
    node: object = DOC
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve (at {part!r})"
        node = node[part]
    return node


def deref(node: object) -> object:
    while isinstance(node, dict) and "$ref" in node and str(node["$ref"]).startswith("#/"):
        node = resolve_local(node["$ref"])
    return node


def file_refs_in(node: object) -> list[str]:
    return [r for r in refs(node) if not r.startswith("#")]


def test_the_document_is_asyncapi_3():
    assert str(DOC["asyncapi"]).startswith("3."), DOC["asyncapi"]
    assert DOC["info"]["title"] and DOC["info"]["version"]


def test_every_channel_address_is_a_gpusched_topic():
    known = {t.name for t in topics.ALL_TOPICS}
    addresses = {name: channel["address"] for name, channel in DOC["channels"].items()}
    assert set(addresses.values()) <= known, addresses
    assert {topics.JOBS_SUBMITTED.name, topics.JOBS_EVENTS.name} <= set(addresses.values())
    for channel in DOC["channels"].values():  # a Kafka binding, when given, names the same topic
        assert channel.get("bindings", {}).get("kafka", {}).get("topic", channel["address"]) == channel["address"]


def test_producers_send_submissions_and_receive_outcomes():
    by_address = {}
    for operation in DOC["operations"].values():
        channel = deref(operation["channel"])
        by_address[channel["address"]] = (operation["action"], {deref(m)["name"] for m in operation["messages"]})
    assert by_address[topics.JOBS_SUBMITTED.name] == ("send", {"JobSubmitted"})
    action, messages = by_address[topics.JOBS_EVENTS.name]
    assert action == "receive" and {"JobAdmitted", "JobRejected"} <= messages


def test_every_local_ref_resolves():
    for ref in refs(DOC):
        if ref.startswith("#"):
            resolve_local(ref)


@pytest.mark.parametrize("ref", sorted(set(file_refs_in(DOC))))
def test_every_file_ref_is_a_schema_beside_the_document(ref):
    path = (SCHEMAS / ref.split("#")[0]).resolve()
    assert path.parent == SCHEMAS.resolve(), f"{ref} leaves schemas/"
    assert path.is_file(), f"{ref}: no such file in schemas/"
    json.loads(path.read_text())


def test_the_submission_headers_are_the_names_admission_reads():
    message = deref(DOC["channels"]["jobsSubmitted"]["messages"]["JobSubmitted"])
    headers = deref(message["headers"])
    assert headers["type"] == "object"
    assert set(headers["required"]) == {producers.PRODUCER_HEADER, producers.SIGNATURE_HEADER}
    assert set(headers["properties"]) == {producers.PRODUCER_HEADER, producers.SIGNATURE_HEADER, "event-type",
                                          "traceparent"}
    assert message["bindings"]["kafka"]["key"]["type"] == "string"
    assert "job id" in message["bindings"]["kafka"]["key"]["description"]


def test_the_submission_payload_is_the_envelope_with_a_jobsubmitted_payload():
    message = deref(DOC["channels"]["jobsSubmitted"]["messages"]["JobSubmitted"])
    payload = deref(message["payload"])
    files = file_refs_in(payload)
    assert "Envelope.json" in files and "JobSubmitted.v1.json" in files
    submitted = json.loads((SCHEMAS / "JobSubmitted.v1.json").read_text())
    assert {"job_id", "spec"} <= set(submitted["required"])
    envelope = json.loads((SCHEMAS / "Envelope.json").read_text())
    assert {"event_id", "type", "schema_version", "stream_id", "occurred_at", "producer", "payload"} \
        <= set(envelope["required"])


@pytest.mark.parametrize("name, schema", [("JobAdmitted", "JobAdmitted.v1.json"),
                                          ("JobRejected", "JobRejected.v1.json")])
def test_each_outcome_references_its_own_schema(name, schema):
    message = deref(DOC["channels"]["jobsEvents"]["messages"][name])
    assert message["name"] == name
    assert set(file_refs_in(message["payload"])) == {"Envelope.json", schema}


def test_the_documented_size_limit_is_the_one_admission_applies():
    from gpusched_common.resources import MAX_COMMAND_BYTES, MAX_SUBMISSION_BYTES

    description = DOC["info"]["description"]
    assert f"`MAX_SUBMISSION_BYTES` = {MAX_SUBMISSION_BYTES} bytes" in description
    assert MAX_COMMAND_BYTES == 64 * 1024 and "64 KiB" in description


def test_the_server_security_is_scram_over_tls():
    server = DOC["servers"]["production"]
    assert server["protocol"] == "kafka-secure"
    assert [deref(s)["type"] for s in server["security"]] == ["scramSha512"]
    submit = next(o for o in DOC["operations"].values() if o["action"] == "send")
    assert [deref(s)["type"] for s in submit["security"]] == ["asymmetricEncryption"]
