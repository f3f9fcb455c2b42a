"""Injectable faults for the simulated backend and the agent (pure parsing and scheduling).

A fault list is comma-separated; each fault is `KIND[:GPU[:VALUE]][@AFTERs[+FORs]]`:

- `xid:GPU:CODE`   the GPU raises XID error CODE (e.g. 79: fell off the bus, 48: double-bit ECC)
- `ecc:GPU[:N]`    N (default 1) uncorrected ECC errors on the GPU
- `thermal:GPU`    thermal throttling (clock slowdown, 90+ C) until `clear:GPU` or its duration ends
- `power:GPU`      power-cap throttling, likewise
- `offbus:GPU`     the GPU falls off the bus: every NVML call on it fails from then on
- `clear:GPU`      ends thermal and power throttling on the GPU
- `partition`      the agent cannot publish (a network partition) for the duration (default 3600 s)

`@30s` delays a fault to 30 s after the agent started; `+10s` makes a throttle or partition last 10 s.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("xid", "ecc", "thermal", "power", "offbus", "clear", "partition")
_NEEDS_GPU = {"xid", "ecc", "thermal", "power", "offbus", "clear"}


@dataclass(frozen=True)
class Fault:
    kind: str
    gpu: int | None = None
    value: int | None = None
    after_s: float = 0.0
    duration_s: float | None = None

    def describe(self) -> str:
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        value = f" {self.value}" if self.value is not None else ""
        return f"{self.kind}{value}{where}"


def _seconds(text: str, whole: str) -> float:
    text = text.strip().removesuffix("s")
    try:
        value = float(text)
    except ValueError as exc:
        raise ValueError(f"bad time {text!r} in fault {whole!r}") from exc
    if value < 0:
        raise ValueError(f"negative time in fault {whole!r}")
    return value


def parse_fault(text: str) -> Fault:
    whole = text.strip()
    body, _, timing = whole.partition("@")
    after_s, duration_s = 0.0, None
    if timing:
        start, _, length = timing.partition("+")
        after_s = _seconds(start, whole)
        duration_s = _seconds(length, whole) if length else None
    elif "+" in body:
        body, _, length = body.partition("+")
        duration_s = _seconds(length, whole)
    parts = body.split(":")
    kind = parts[0].strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r} in {whole!r}; known: {', '.join(KINDS)}")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError as exc:
        raise ValueError(f"fault {whole!r}: GPU and value must be integers") from exc
    if kind in _NEEDS_GPU and not numbers:
        raise ValueError(f"fault {whole!r} needs a GPU index ({kind}:GPU)")
    if kind == "xid" and len(numbers) < 2:
        raise ValueError(f"fault {whole!r} needs an XID code (xid:GPU:CODE)")
    gpu = numbers[0] if numbers else None
    value = numbers[1] if len(numbers) > 1 else (1 if kind == "ecc" else None)
    return Fault(kind, gpu, value, after_s, duration_s)


def parse_faults(text: str) -> tuple[Fault, ...]:
    """Parse a fault list; a throttle with a duration is followed by the `clear` that ends it."""
    faults: list[Fault] = []
    for part in text.split(","):
        if not part.strip():
            continue
        fault = parse_fault(part)
        faults.append(fault)
        if fault.kind in ("thermal", "power") and fault.duration_s is not None:
            faults.append(Fault("clear", fault.gpu, None, fault.after_s + fault.duration_s))
    return tuple(faults)


def due_faults(schedule: tuple[Fault, ...], applied: frozenset[int], elapsed_s: float) -> tuple[int, ...]:
    """Positions in `schedule` of faults due at `elapsed_s` that were not applied yet."""
    return tuple(i for i, fault in enumerate(schedule) if i not in applied and fault.after_s <= elapsed_s)


def partitioned(schedule: tuple[Fault, ...], elapsed_s: float) -> bool:
    """Whether a scheduled partition covers `elapsed_s`."""
    for fault in schedule:
        if fault.kind == "partition":
            end = fault.after_s + (fault.duration_s if fault.duration_s is not None else 3600.0)
            if fault.after_s <= elapsed_s < end:
                return True
    return False
