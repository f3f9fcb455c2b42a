"""`gpusched agent --check [--json] [--simulated MODEL:COUNT]`: the node's inventory and a few telemetry
samples, read the way the node agent reads them (real NVML, or the simulated backend)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpusched_common.table import render


def add_agent_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("agent", help="node agent tools: --check prints this node's GPUs and telemetry")
    p.add_argument("--check", action="store_true", help="print inventory, health and telemetry samples, then exit")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--simulated", metavar="MODEL:COUNT", help="use the simulated backend, e.g. H100-80GB:8")
    p.add_argument("--samples", type=int, default=3, help="telemetry samples to take (default 3)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--node-id", default="local")
    p.set_defaults(func=run_agent)
    return p


def run_agent(args: argparse.Namespace) -> int:
    if not args.check:
        print("gpusched agent: only --check is supported here; agents run as `python -m services.node_agent`",
              file=sys.stderr)
        return 2
    from services.node_agent.nvml import make_backend
    from services.node_agent.real_nvml import NvmlUnavailable

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


def check(backend, samples: int, interval_s: float) -> dict:
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
