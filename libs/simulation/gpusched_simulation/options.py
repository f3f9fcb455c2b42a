"""Command-line values the sub-commands parse alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence


def parse_names(text: str, known: Sequence[str], what: str = "policies") -> list[str]:
    """A comma list of names from ``known`` (or ``all``), each once, in the order given."""
    names = list(known) if text.strip() == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def run_standalone(prog: str, configure: Callable[[argparse.ArgumentParser], None],
                   run: Callable[[argparse.Namespace], int], argv: Sequence[str] | None) -> int:  # fmt: skip
    """Parse ``argv`` with a sub-command's own options and run it, without the gpusched CLI."""
    parser = argparse.ArgumentParser(prog=prog)
    configure(parser)
    return run(parser.parse_args(argv))
