"""Kubernetes resource quantities, exactly (pure, ``decimal.Decimal``): a number (``2``, ``4.03``,
``.5``, ``1.``), then one suffix: decimal SI (``n u m k M G T P E``), binary SI (``Ki Mi Gi Ti Pi Ei``)
or a decimal exponent (``129e6``, ``1E3``, ``5e-3``; ``1E`` alone is an exa). A resource quantity has no
sign. CPU is counted in milli-cores and memory in MiB, both rounded up (as Kubernetes rounds a CPU
request up to the milli-core); a count of devices (GPUs, MIG slices) must be a whole number."""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation, Overflow, localcontext

MAX_TEXT = 64  # characters of one quantity
MAX_EXPONENT = 40
MAX_VALUE = Decimal(2**63 - 1)  # what Kubernetes holds in an int64

SUFFIXES: dict[str, Decimal] = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_EXACT = Context(prec=200, Emax=10**4, Emin=-(10**4), traps=[InvalidOperation, Overflow])
MIB = Decimal(2**20)


class QuantityError(ValueError):
    """A value that is no resource quantity; the message says what was expected."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a quantity: a string (``"1.5Gi"``), an integer, or a YAML float (``4.03`` is
    read as written, never through binary rounding)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise QuantityError(f"expected a quantity such as 2, 500m or 64Gi, got {_type(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a quantity such as 2, 500m or 64Gi, got {value!r}")
        text = repr(value)  # the shortest text that is this float: what the YAML said
    else:
        text = str(value).strip()
    if len(text) > MAX_TEXT:
        raise QuantityError(f"a quantity is at most {MAX_TEXT} characters, got {len(text)}")
    match = _QUANTITY.match(text.replace("E+", "e+") if isinstance(value, float) else text)
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity (a number with one of the suffixes n u m k M G T P E, "
                            "Ki Mi Gi Ti Pi Ei, or an exponent such as e6)")
    if match.group("sign"):
        raise QuantityError(f"{text!r}: a resource quantity has no sign")
    with localcontext(_EXACT):
        number = Decimal(match.group("number"))
        exponent = match.group("exponent")
        if exponent is not None:
            power = int(exponent[1:])
            if abs(power) > MAX_EXPONENT:
                raise QuantityError(f"{text!r}: the exponent is out of range (at most {MAX_EXPONENT})")
            result = number.scaleb(power)
        else:
            result = number * SUFFIXES[match.group("suffix") or ""]
    if result > MAX_VALUE:
        raise QuantityError(f"{text!r} is too large")
    return result


def ceil(value: Decimal) -> int:
    with localcontext(_EXACT):
        return int(value.to_integral_value(rounding=ROUND_CEILING))


def cpu_milli(value: object) -> int:
    """A CPU quantity (``2``, ``1.5``, ``500m``, ``4.03``) in milli-cores, rounded up."""
    with localcontext(_EXACT):
        return ceil(parse_quantity(value) * 1000)


def memory_mib(value: object) -> int:
    """A memory quantity (``64Gi``, ``512Mi``, ``1G``, ``129e6`` bytes) in MiB, rounded up."""
    with localcontext(_EXACT):
        return ceil(parse_quantity(value) / MIB)


def whole_count(value: object) -> int:
    """A count of devices (``2``, ``"2"``): a whole number; ``1.5`` is refused."""
    quantity = parse_quantity(value)
    with localcontext(_EXACT):
        if quantity != quantity.to_integral_value():
            raise QuantityError(f"must be a whole number, got {_show(value)}")
        return int(quantity)


def _show(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _type(value: object) -> str:
    return {bool: "a boolean", dict: "a mapping", list: "a list", type(None): "null"}.get(type(value),
                                                                                        type(value).__name__)
