"""Submit one GPU job to gpusched as a credentialed producer: the wire contract of schemas/asyncapi.yaml,
with nothing but the standard library, `cryptography` and `aiokafka` (no gpusched package).

    export GPUSCHED_KAFKA_BOOTSTRAP=kafka.example.internal:9093
    export GPUSCHED_PRODUCER_KEY_FILE=/etc/my-platform/gpusched.key   # from `gpusched producers create`
    python producer.py --tenant research --gpus 2 -- python train.py --epochs 3

Prints the job id; the outcome (JobAdmitted, or JobRejected with reasons) appears keyed by that id on
`gpusched.jobs.events`. For a broker with SASL_SSL set GPUSCHED_KAFKA_SASL_USERNAME,
GPUSCHED_KAFKA_SASL_PASSWORD_FILE and GPUSCHED_KAFKA_SSL_CAFILE.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import re
import ssl
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

from aiokafka import AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

TOPIC = "gpusched.jobs.submitted"
MAX_SUBMISSION_BYTES = 1024 * 1024  # admission rejects anything larger
KEY_PATTERN = re.compile(r"^gsk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")  # gsk_<producer id>_<Ed25519 seed>


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()  # urlsafe, unpadded


def read_key(path: str) -> tuple[str, Ed25519PrivateKey]:
    """(producer id, signing key) from the key text `gpusched producers create` printed."""
    match = KEY_PATTERN.match(Path(path).read_text().strip())
    if match is None:
        sys.exit(f"{path}: not a gpusched producer key (gsk_<16 hex>_<43 characters>)")
    seed = base64.urlsafe_b64decode(match.group(2) + "=")  # 43 characters: one pad character short
    return match.group(1), Ed25519PrivateKey.from_private_bytes(seed)


def job_id_for(tenant: str, request_id: str | None) -> str:
    # with a request id, a retry names the same job (and admission creates no second one)
    if request_id:
        return "j-" + hashlib.sha256(f"{tenant}\0{request_id}".encode()).hexdigest()[:16]
    return f"j-{uuid.uuid4().hex[:16]}"


def envelope(producer_id: str, job_id: str, spec: dict, request_id: str | None) -> bytes:
    now = datetime.now(timezone.utc).isoformat()  # noqa: UP017 - also runs on Python < 3.11
    doc = {
        "event_id": str(uuid.uuid4()),  # fresh per message: a redelivery of the same id is ignored
        "type": "JobSubmitted",
        "schema_version": 1,
        "stream_id": f"job-{job_id}",  # a job's event stream
        "occurred_at": now,
        "producer": producer_id,  # free text naming the sender; admission trusts only the signature
        "tenant": spec["tenant"],
        "payload": {"job_id": job_id, "spec": spec, "submitted_at": now, "request_id": request_id},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def kafka_security() -> dict:
    """SASL/SCRAM over TLS when a Kafka user is configured, else plaintext (a development broker)."""
    user = os.environ.get("GPUSCHED_KAFKA_SASL_USERNAME")
    if not user:
        return {}
    password = Path(os.environ["GPUSCHED_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
    context = ssl.create_default_context(cafile=os.environ.get("GPUSCHED_KAFKA_SSL_CAFILE"))
    return {"security_protocol": "SASL_SSL", "ssl_context": context, "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": user, "sasl_plain_password": password}


async def publish(bootstrap: str, job_id: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **kafka_security())
    await producer.start()
    try:
        await producer.send_and_wait(TOPIC, value, key=job_id.encode(), headers=headers)  # key: the job id
    finally:
        await producer.stop()


def main() -> None:
    p = argparse.ArgumentParser(description="Submit a GPU job to gpusched as a credentialed producer.")
    p.add_argument("--bootstrap", default=os.environ.get("GPUSCHED_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--key-file", default=os.environ.get("GPUSCHED_PRODUCER_KEY_FILE"))
    p.add_argument("--tenant", required=True, help="one of the tenants the producer is bound to")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--request-id", help="idempotency key: resubmitting it creates no second job")
    p.add_argument("command", nargs="+", help="after --: the command the job runs")
    args = p.parse_args()
    if not args.key_file:
        p.error("--key-file or GPUSCHED_PRODUCER_KEY_FILE is required")
    producer_id, key = read_key(args.key_file)
    job_id = job_id_for(args.tenant, args.request_id)
    value = envelope(producer_id, job_id, {"tenant": args.tenant, "gpus": args.gpus, "command": args.command},
                     args.request_id)
    if len(value) > MAX_SUBMISSION_BYTES:
        sys.exit(f"submission is {len(value)} bytes; the limit is {MAX_SUBMISSION_BYTES}")
    # the signature covers these exact bytes: send them as they are, never re-serialized
    headers = [("gpusched-producer", producer_id.encode()),
               ("gpusched-producer-signature", b64(key.sign(value)).encode()),
               ("event-type", b"JobSubmitted")]
    asyncio.run(publish(args.bootstrap, job_id, value, headers))
    print(job_id)


if __name__ == "__main__":
    main()
