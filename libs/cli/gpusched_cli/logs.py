"""`gpusched logs JOB [-f] [--rank N] [--tail N]`: a job's output (stdout and stderr) through the gateway,
which reads it from the agent of the node the job ran on; the user needs no access to the node.

Wiring (CLI): `add_logs_parser(subparsers)`; the parser's default `func` is `run_logs(args) -> int`.
"""

from __future__ import annotations

import argparse
import sys

from gpusched import Client


def add_logs_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("logs", help="a job's output (stdout and stderr), through the gateway")
    p.add_argument("job_id")
    p.add_argument("--rank", type=int, default=0, help="a gang member's output (0: its first node)")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p.set_defaults(func=run_logs)
    return p


def last_lines(text: bytes, lines: int | None) -> bytes:
    """The last ``lines`` lines of ``text`` (all of it for None)."""
    if lines is None:
        return text
    if lines <= 0:
        return b""
    kept = text.splitlines(keepends=True)[-lines:]
    return b"".join(kept)


def run_logs(args: argparse.Namespace) -> int:
    from gpusched_cli.job_commands import through_gateway

    def work(client: Client) -> int:
        out = sys.stdout.buffer
        if args.follow and args.tail is None:
            for chunk in client.follow_logs(args.job_id, rank=args.rank):
                out.write(chunk)
                out.flush()
            return 0
        text, offset = client.logs(args.job_id, rank=args.rank)
        out.write(last_lines(text, args.tail))
        out.flush()
        if args.follow:
            for chunk in client.follow_logs(args.job_id, rank=args.rank, offset=offset):
                out.write(chunk)
                out.flush()
        return 0

    try:
        return through_gateway("logs", work)
    except KeyboardInterrupt:
        return 0
