"""`python -m services.node_agent --check [--json] [--simulated MODEL:COUNT] [--samples N] [--interval S]
[--node-id ID]`: the node's inventory, health and a few telemetry samples, read the way the agent reads
them (real NVML, or the simulated backend), then exit: 0 when every GPU answers, 1 when one does not or
NVML is missing, 2 for a bad simulated spec. `gpusched agent --check` runs this.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpusched_common.table import render

from services.node_agent.nvml import NvmlBackend, make_backend
from services.node_agent.real_nvml import NvmlUnavailable


def add_check_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--check", action="store_true", help="print inventory, health and telemetry samples, then exit")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--simulated", metavar="MODEL:COUNT", help="use the simulated backend, e.g. H100-80GB:8")
    parser.add_argument("--samples", type=int, default=3, help="telemetry samples to take (default 3)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--node-id", default="local")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = add_check_arguments(argparse.ArgumentParser(prog="python -m services.node_agent")).parse_args(argv)
    return run_check(args)


def run_check(args: argparse.Namespace) -> int:
    try:
        backend = make_backend("simulated" if args.simulated else "real", args.node_id, args.simulated or "")
    except NvmlUnavailable as exc:
        print(f"gpusched agent --check: {exc}; use --simulated MODEL:COUNT for the simulated backend",
              file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"gpusched agent --check: {exc}", file=sys.stderr)
        return 2
    try:
        report = check(backend, max(1, args.samples), max(0.0, args.interval))
    finally:
        backend.close()
    print(json.dumps(report, indent=2) if args.json else render_report(report))
    return 0 if all(h["reachable"] for h in report["health"]) else 1


def check(backend: NvmlBackend, samples: int, interval_s: float) -> dict:
    info = backend.node_info()
    taken = []
    for n in range(samples):
        if n:
            time.sleep(interval_s)
        taken.append([s.model_dump() for s in backend.sample()])
    health = [{"index": h.index, "uuid": h.uuid, "reachable": h.reachable, "xids": list(h.xids),
               "ecc_uncorrected": h.ecc_uncorrected, "throttle_reasons": list(h.throttle_reasons)}
              for h in backend.health()]
    return {"backend": info.backend, "hostname": info.hostname, "driver_version": info.driver_version,
            "cuda_version": info.cuda_version, "cpu_milli": info.cpu_milli, "memory_mib": info.memory_mib,
            "gpus": [g.model_dump() for g in info.gpus], "health": health, "samples": taken}


def render_report(report: dict) -> str:
    head = render(["FIELD", "VALUE"], [(k, report[k]) for k in ("backend", "hostname", "driver_version",
                                                                 "cuda_version", "cpu_milli", "memory_mib")])
    gpus = render(["GPU", "UUID", "MODEL", "MEMORY MiB", "MIG", "NVLINK DOMAIN", "PEERS"],
                  [(g["index"], g["uuid"], g["model"], g["memory_mib"],
                    ", ".join(d["profile"] for d in g["mig_devices"]) or ("on" if g["mig_enabled"] else "off"),
                    g["nvlink_domain"], ",".join(map(str, g["nvlink_peers"]))) for g in report["gpus"]])
    health = render(["GPU", "REACHABLE", "XIDS", "ECC UNCORRECTED", "THROTTLE"],
                    [(h["index"], h["reachable"], ",".join(map(str, h["xids"])) or "-", h["ecc_uncorrected"],
                      ",".join(h["throttle_reasons"]) or "-") for h in report["health"]])
    rows = [(n + 1, s["index"], f"{s['utilization_pct']:.0f}%", f"{s['memory_used_mib']}/{s['memory_total_mib']}",
             s["power_w"], s["temperature_c"], s["sm_clock_mhz"], len(s["processes"]))
            for n, sample in enumerate(report["samples"]) for s in sample]
    samples = render(["#", "GPU", "UTIL", "MEMORY MiB", "POWER W", "TEMP C", "SM MHz", "PROCS"], rows)
    return f"{head}\n\n{gpus}\n\n{health}\n\n{samples}"
