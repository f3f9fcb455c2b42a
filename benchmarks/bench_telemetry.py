"""Telemetry throughput of one metrics consumer: 1,000 simulated nodes x 8 GPUs at 1 sample per node per
second, consumed by the metrics service's telemetry path, beside the same run's broker floor.

Run: ``python benchmarks/bench_telemetry.py [--nodes 1000] [--gpus 8] [--seconds 10]``.
Starts its own Tansu broker. Protocol:
1. produce `seconds` worth of telemetry (nodes x seconds messages of `gpus` samples each, built by the
   simulated agents' code path) onto the telemetry topic;
2. floor: a raw consumer reads every message without parsing (broker messages/s);
3. metrics: the metrics service's TelemetryConsumer reads the same messages and folds each into its
   tracker (parse, validate, check the node's signature, record); wall time and this process's CPU time
   give samples/s and CPU microseconds per GPU sample; every message is signed by its node's own key
   (issue 14) and the cost of that check alone is measured beside it (verify_us_per_msg).
Prints a table and writes ``bench-results/telemetry.json`` (gpu_samples_per_s, cpu_us_per_sample,
floor_broker_msgs_per_s, ...). The goal is 8,000 GPU samples/s on one core (<= 125 us CPU per sample);
compare ratios to the floor, not absolute numbers (the machines are noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from gpusched_common import events as ev  # noqa: E402
from gpusched_common import node_keys, signing  # noqa: E402
from gpusched_common.producers import ProducerKey  # noqa: E402
from gpusched_common.kafka_admin import create_topics  # noqa: E402
from gpusched_common.settings import Settings  # noqa: E402
from gpusched_common.topics import NODES_TELEMETRY  # noqa: E402
from gpusched_common.infra.brokers import start_broker, stop_broker  # noqa: E402
from gpusched_common.table import render  # noqa: E402
from services.metrics.telemetry_consumer import TelemetryConsumer  # noqa: E402
from services.metrics.tracker import TelemetryTracker  # noqa: E402
from services.node_agent.simulated import SimulatedNvml  # noqa: E402

GOAL_SAMPLES_PER_S = 8000


def node_identities(nodes: int) -> tuple[list[ProducerKey], node_keys.NodeKeys]:
    """Each simulated node's own key, and what the metrics consumer knows of them (as if enrolled)."""
    keys = [signing.new_key()[1] for _ in range(nodes)]
    known = node_keys.NodeKeys(ttl_s=3600.0)
    for n, key in enumerate(keys):
        known.put(node_keys.NodeKey(key.producer_id, f"sim-{n:04d}", key.public_key(), "0" * 16,
                                    datetime.now(timezone.utc), None))
    return keys, known


def verify_cost(keys: list[ProducerKey], known: node_keys.NodeKeys, gpus: int, count: int = 2000) -> float:
    """CPU microseconds to judge one signed telemetry message (signature, key, node, window), alone."""
    backend = SimulatedNvml("sim-0000", f"H100-80GB:{gpus}")
    value = ev.make_envelope(ev.GpuTelemetry(node_id="sim-0000", sampled_at=datetime.now(timezone.utc),
                                             samples=backend.sample()), event_id="x", stream_id="node-sim-0000",
                             occurred_at=datetime.now(timezone.utc), producer="node-agent").model_dump_json().encode()
    headers = signing.Signer(keys[0]).headers(NODES_TELEMETRY.name, value)
    key = known.get(keys[0].producer_id)
    start, now = time.process_time(), time.time()
    for _ in range(count):
        assert node_keys.judge(NODES_TELEMETRY.name, value, headers, "sim-0000", key, now=now, max_age_s=300.0,
                               max_skew_s=300.0) is None
    return (time.process_time() - start) / count * 1e6


async def produce(bootstrap: str, nodes: int, gpus: int, seconds: int,
                  keys: list[ProducerKey]) -> tuple[int, float]:
    """Telemetry of `nodes` simulated nodes for `seconds` ticks, each message signed by its node's key;
    returns (messages, seconds taken)."""
    backends = [SimulatedNvml(f"sim-{n:04d}", f"H100-80GB:{gpus}") for n in range(nodes)]
    for n, backend in enumerate(backends):
        if n % 2 == 0:  # half the nodes run a job on every GPU, so samples carry processes
            backend.attach(f"job-{n}", tuple(range(gpus)), pid=10_000 + n)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024,
                                enable_idempotence=False, acks=1)
    await producer.start()
    start = time.perf_counter()
    t0 = datetime.now(timezone.utc)
    sent = 0
    try:
        for tick in range(seconds):
            at = t0 + timedelta(seconds=tick)
            futures = []
            for n, backend in enumerate(backends):
                node_id = f"sim-{n:04d}"
                payload = ev.GpuTelemetry(node_id=node_id, sampled_at=at, samples=backend.sample())
                envelope = ev.make_envelope(payload, event_id=f"{node_id}-{tick}", stream_id=f"node-{node_id}",
                                            occurred_at=at, producer=f"node-agent/{node_id}")
                value = envelope.model_dump_json().encode()
                signed = signing.Signer(keys[n]).headers(NODES_TELEMETRY.name, value)
                futures.append(await producer.send(NODES_TELEMETRY.name, value, key=node_id.encode(),
                                                   headers=[("event-type", b"GpuTelemetry"),
                                                            *((k, v.encode()) for k, v in signed.items())]))
            await asyncio.gather(*futures)
            sent += len(futures)
    finally:
        await producer.stop()
    return sent, time.perf_counter() - start


async def floor(bootstrap: str, expected: int) -> float:
    """Messages/s a raw consumer reads from the broker, no parsing: what no consumer can beat."""
    consumer = AIOKafkaConsumer(NODES_TELEMETRY.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, max_partition_fetch_bytes=2 * 1024 * 1024)
    await consumer.start()
    try:
        seen, start = 0, time.perf_counter()
        while seen < expected:
            for records in (await consumer.getmany(timeout_ms=500, max_records=5000)).values():
                seen += len(records)
        return seen / (time.perf_counter() - start)
    finally:
        await consumer.stop()


async def metrics(bootstrap: str, expected: int, known: node_keys.NodeKeys) -> tuple[float, float, TelemetryTracker]:
    """(wall seconds, CPU seconds) for the metrics telemetry path to take every message (each verified)."""
    tracker = TelemetryTracker()
    consumer = TelemetryConsumer(Settings(kafka_bootstrap=bootstrap), tracker, group_id=None, keys=known)
    wall, cpu = time.perf_counter(), time.process_time()
    await consumer.run(stop_after_messages=expected)
    return time.perf_counter() - wall, time.process_time() - cpu, tracker


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as home:
        broker = start_broker(args.broker, Path(home))
        bootstrap = broker.bootstrap
        try:
            await create_topics(bootstrap, partitions=6)
            keys, known = node_identities(args.nodes)
            messages, produce_s = await produce(bootstrap, args.nodes, args.gpus, args.seconds, keys)
            floor_rate = await floor(bootstrap, messages)
            wall_s, cpu_s, tracker = await metrics(bootstrap, messages, known)
            verify_us = verify_cost(keys, known, args.gpus)
        finally:
            stop_broker(broker)
    samples = tracker.samples
    assert tracker.messages == messages, (tracker.messages, messages)
    result = {
        "broker": args.broker, "nodes": args.nodes, "gpus_per_node": args.gpus, "seconds_of_telemetry": args.seconds,
        "messages": messages, "gpu_samples": samples,
        "produce_msgs_per_s": round(messages / produce_s, 1),
        "floor_broker_msgs_per_s": round(floor_rate, 1),
        "metrics_msgs_per_s": round(messages / wall_s, 1),
        "gpu_samples_per_s": round(samples / wall_s, 1),
        "cpu_us_per_sample": round(cpu_s / samples * 1e6, 2),
        "cpu_us_per_msg": round(cpu_s / messages * 1e6, 1),
        "verify_us_per_msg": round(verify_us, 1),  # of cpu_us_per_msg: the node signature's check alone
        "verify_share_of_msg": round(verify_us / (cpu_s / messages * 1e6), 3),
        "ratio_to_floor": round(messages / wall_s / floor_rate, 3),
        "one_core_samples_per_s": round(samples / cpu_s, 1),
        "goal_samples_per_s": GOAL_SAMPLES_PER_S,
        "keeps_up": samples / cpu_s >= GOAL_SAMPLES_PER_S,
        "required_msgs_per_s": args.nodes,
    }
    return result


def report(result: dict) -> str:
    rows = [
        ("telemetry produced", f"{result['messages']} msgs ({result['gpu_samples']} GPU samples)", ""),
        ("broker floor (raw consume)", f"{result['floor_broker_msgs_per_s']:.0f} msgs/s", "1.00"),
        ("metrics consumer", f"{result['metrics_msgs_per_s']:.0f} msgs/s", f"{result['ratio_to_floor']:.2f}"),
        ("GPU samples/s (wall)", f"{result['gpu_samples_per_s']:.0f}", ""),
        ("CPU per GPU sample", f"{result['cpu_us_per_sample']:.1f} us", ""),
        ("CPU per message", f"{result['cpu_us_per_msg']:.0f} us", ""),
        ("of it: node signature check", f"{result['verify_us_per_msg']:.0f} us",
         f"{result['verify_share_of_msg']:.2f} of a message"),
        ("GPU samples/s on one core", f"{result['one_core_samples_per_s']:.0f}",
         f"goal {result['goal_samples_per_s']}: {'met' if result['keeps_up'] else 'NOT met'}"),
    ]
    return render(["MEASURE", "VALUE", "RATIO / NOTE"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--out", default=str(ROOT / "bench-results" / "telemetry.json"))
    args = parser.parse_args()
    result = asyncio.run(main(args))
    print(report(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
