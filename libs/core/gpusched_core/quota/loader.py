"""The tenancy file (YAML, ``version: 1``): parsed, validated, and turned into a ``Tenancy``.

Pure: the caller reads the file (or an admin event's body) and passes the text or the parsed
document. Every problem is reported at once, each with its place in the file::

    tenancy file is invalid (2 problems):
      - tenants[0].children[1] (team-b): quota A100-80GB: lending_limit 20 exceeds nominal 16
      - default_priority_class: 'urgent' is not a priority class (known: batch, production)

See ``deploy/tenants.example.yaml`` for a commented example.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpusched_core.durations import format_duration, parse_duration

from .model import FlavorQuota, Tenancy, Tenant, TimeLimits
from .units import gpus_to_units

SUPPORTED_VERSIONS = (1,)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class TenancyError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(f"tenancy file is invalid ({len(problems)} {noun}):\n"
                         + "\n".join(f"  - {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FlavorQuotaDoc(_Strict):
    nominal: float = Field(default=0, ge=0)
    borrowing_limit: float | None = Field(default=None, ge=0)
    lending_limit: float | None = Field(default=None, ge=0)


class TenantDoc(_Strict):
    name: str
    weight: float = Field(default=1.0, gt=0)
    priority_classes: list[str] = Field(default_factory=list)
    quota: dict[str, FlavorQuotaDoc] = Field(default_factory=dict)
    children: list[TenantDoc] = Field(default_factory=list)
    # job time limits (seconds, or 90m, 2h, 7d): a job naming none gets the default; none may ask more than
    # the maximum. Inherited from the nearest ancestor that sets them.
    default_time_limit: float | str | None = None
    max_time_limit: float | str | None = None


class UnitsDoc(_Strict):
    gpu_equivalents: dict[str, float] = Field(default_factory=dict)
    mig_slices_per_gpu: dict[str, int] = Field(default_factory=dict)


class FairShareDoc(_Strict):
    half_life_s: float = Field(default=7 * 24 * 3600, ge=0)


class TenancyDoc(_Strict):
    version: int
    revision: int = Field(default=0, ge=0)
    flavors: list[str] | None = None
    units: UnitsDoc = Field(default_factory=UnitsDoc)
    priority_classes: dict[str, int] = Field(default_factory=lambda: {"default": 0})
    default_priority_class: str | None = None
    fair_share: FairShareDoc = Field(default_factory=FairShareDoc)
    guest_tenant: str | None = None
    tenants: list[TenantDoc] = Field(min_length=1)


def load_tenancy(text: str) -> Tenancy:
    """Parse YAML text into a validated tenancy; raises ``TenancyError`` listing every problem."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TenancyError([f"not valid YAML: {exc}"]) from exc
    if not isinstance(doc, Mapping):
        raise TenancyError(["the document must be a mapping with 'version' and 'tenants'"])
    return parse_tenancy(doc)


def parse_tenancy(doc: Mapping[str, Any]) -> Tenancy:
    version = doc.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise TenancyError([f"version: {version!r} is not supported (supported: {SUPPORTED_VERSIONS})"])
    try:
        parsed = TenancyDoc.model_validate(doc)
    except ValidationError as exc:
        raise TenancyError([_pydantic_problem(err) for err in exc.errors()]) from None
    problems: list[str] = []
    flavors = _flavors(parsed, problems)
    default_class = _default_class(parsed, problems)
    tenants: dict[str, Tenant] = {}
    for i, top in enumerate(parsed.tenants):
        _collect(top, None, f"tenants[{i}]", frozenset(parsed.priority_classes), parsed, flavors, tenants,
                 problems)
    _check_units(parsed, problems)
    _check_guest(parsed.guest_tenant, tenants, problems)
    if problems:
        raise TenancyError(problems)
    return Tenancy(version=parsed.version, tenants=MappingProxyType(tenants), flavors=flavors,
                   priority_classes=MappingProxyType(dict(parsed.priority_classes)),
                   default_priority_class=default_class,
                   gpu_equivalents=MappingProxyType(dict(parsed.units.gpu_equivalents)),
                   mig_slices_per_gpu=MappingProxyType(dict(parsed.units.mig_slices_per_gpu)),
                   half_life_s=parsed.fair_share.half_life_s, revision=parsed.revision,
                   guest_tenant=parsed.guest_tenant)


def _pydantic_problem(err: Mapping[str, Any]) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ())).lstrip(".")
    return f"{where or 'document'}: {err.get('msg', 'invalid')}"


def _flavors(parsed: TenancyDoc, problems: list[str]) -> tuple[str, ...]:
    named: list[str] = []

    def walk(t: TenantDoc) -> None:
        named.extend(f for f in t.quota if f not in named)
        for child in t.children:
            walk(child)

    for top in parsed.tenants:
        walk(top)
    if parsed.flavors is None:
        return tuple(named)
    unknown = [f for f in named if f not in parsed.flavors]
    if unknown:
        problems.append(f"flavors: quota given for flavors not listed: {', '.join(unknown)}")
    return tuple(dict.fromkeys(parsed.flavors))


def _default_class(parsed: TenancyDoc, problems: list[str]) -> str:
    classes = parsed.priority_classes
    if not classes:
        problems.append("priority_classes: at least one priority class is required")
        return ""
    name = parsed.default_priority_class or min(classes, key=lambda c: (classes[c], c))
    if name not in classes:
        problems.append(f"default_priority_class: {name!r} is not a priority class "
                        f"(known: {', '.join(sorted(classes))})")
    return name


def _time_limits(doc: TenantDoc, inherited: TimeLimits, here: str, problems: list[str]) -> TimeLimits:
    values = {}
    for name, given, before in (("default_time_limit", doc.default_time_limit, inherited.default_s),
                                ("max_time_limit", doc.max_time_limit, inherited.max_s)):
        try:
            values[name] = parse_duration(given) if given is not None else before
        except ValueError as exc:
            problems.append(f"{here}: {name}: {exc}")
            values[name] = before
    limits = TimeLimits(values["default_time_limit"], values["max_time_limit"])
    if limits.default_s is not None and limits.max_s is not None and limits.default_s > limits.max_s:
        problems.append(f"{here}: default_time_limit {format_duration(limits.default_s)} exceeds max_time_limit "
                        f"{format_duration(limits.max_s)}")
    return limits


def _collect(doc: TenantDoc, parent: str | None, where: str, inherited: frozenset[str], parsed: TenancyDoc,
             flavors: tuple[str, ...], out: dict[str, Tenant], problems: list[str],
             inherited_limits: TimeLimits = TimeLimits()) -> None:
    here = f"{where} ({doc.name})"
    limits = _time_limits(doc, inherited_limits, here, problems)
    if not NAME.match(doc.name):
        problems.append(f"{where}: name {doc.name!r} must be 1-63 letters, digits, '.', '_' or '-'")
    if doc.name in out:
        problems.append(f"{here}: tenant name is used twice")
    unknown = [c for c in doc.priority_classes if c not in parsed.priority_classes]
    if unknown:
        problems.append(f"{here}: unknown priority classes {', '.join(unknown)}")
    classes = frozenset(doc.priority_classes) & frozenset(parsed.priority_classes) or inherited
    quota = {f: _flavor_quota(q, f, bool(doc.children), here, problems) for f, q in doc.quota.items()}
    out[doc.name] = Tenant(doc.name, parent, tuple(c.name for c in doc.children),
                           MappingProxyType({f: q for f, q in quota.items() if f in flavors}), doc.weight, classes,
                           limits)
    for j, child in enumerate(doc.children):
        _collect(child, doc.name, f"{where}.children[{j}]", classes, parsed, flavors, out, problems, limits)


def _flavor_quota(q: FlavorQuotaDoc, flavor: str, inner: bool, here: str, problems: list[str]) -> FlavorQuota:
    if inner and q.nominal:
        problems.append(f"{here}: quota {flavor}: an organisation has no nominal quota of its own "
                        f"(it pools its teams'); set nominal on its teams")
    if not inner and q.lending_limit is not None and q.lending_limit > q.nominal:
        problems.append(f"{here}: quota {flavor}: lending_limit {q.lending_limit:g} exceeds nominal {q.nominal:g}")
    return FlavorQuota(
        nominal=gpus_to_units(q.nominal),
        borrowing_limit=None if q.borrowing_limit is None else gpus_to_units(q.borrowing_limit),
        lending_limit=None if q.lending_limit is None else gpus_to_units(q.lending_limit))


def _check_guest(guest: str | None, tenants: Mapping[str, Tenant], problems: list[str]) -> None:
    if guest is None:
        return
    if guest not in tenants:
        problems.append(f"guest_tenant: {guest!r} is not a tenant of this file")
    elif not tenants[guest].is_leaf:
        problems.append(f"guest_tenant: {guest!r} is an organisation; name a team (a tenant without children)")


def _check_units(parsed: TenancyDoc, problems: list[str]) -> None:
    for model, geq in parsed.units.gpu_equivalents.items():
        if geq <= 0:
            problems.append(f"units.gpu_equivalents.{model}: must be positive, got {geq:g}")
    for model, slices in parsed.units.mig_slices_per_gpu.items():
        if slices not in (1, 2, 4, 7):
            problems.append(f"units.mig_slices_per_gpu.{model}: must be 1, 2, 4 or 7, got {slices}")
