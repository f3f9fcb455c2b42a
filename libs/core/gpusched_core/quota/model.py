"""The tenancy model: an organisation -> team tree with quota per flavor, borrowing and lending.

Every top-level tenant is the root of a *cohort*: the tenants under one root lend their unused
quota to each other, bounded by lending and borrowing limits; different roots never share. Only
leaves (teams) own nominal quota and run jobs; an inner node (an organisation) pools what its
children lend and may carry its own borrowing and lending limits towards its siblings.

Capacity rules (per flavor, all amounts in quota units, see ``units``):

- ``guaranteed(n) = pool(n) - lending_limit(n)`` (0 without a lending limit): never lent out.
- ``pool(leaf) = nominal``; ``pool(inner) = sum over children c of (pool(c) - guaranteed(c))``.
- ``used(leaf)`` is what its jobs reserved; ``used(inner) = sum over c of max(0, used(c) - guaranteed(c))``.
- ``available(root) = pool(root) - used(root)``; below the root ``available(n) =
  max(0, guaranteed(n) - used(n)) + min(available(parent), pool(n) - guaranteed(n)
  - max(0, used(n) - guaranteed(n)) + borrowing_limit(n))`` (no ``min`` without a borrowing limit).

A job of ``u`` units fits tenant ``t`` iff ``u <= available(t)``. Reserving only what fits keeps two
invariants: a leaf's usage never exceeds ``nominal + borrowing_limit`` and a cohort never lends more
than its members put in (``used(root) <= pool(root)``, and the same at every inner node).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NewType

TenantId = NewType("TenantId", str)
JobId = NewType("JobId", str)
UNLIMITED = None


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """One tenant's quota of one flavor, in units. ``None`` limits are unlimited. ``nominal`` of an
    inner node is always 0: organisations pool their teams' quota."""

    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    parent: str | None
    children: tuple[str, ...]
    quota: Mapping[str, FlavorQuota]
    weight: float
    priority_classes: frozenset[str]  # resolved: inherited from the nearest ancestor that lists any
    time_limits: TimeLimits = field(default_factory=lambda: TimeLimits())  # resolved like priority classes

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def flavor_quota(self, flavor: str) -> FlavorQuota:
        return self.quota.get(flavor, _NO_QUOTA)


_NO_QUOTA = FlavorQuota()


@dataclass(frozen=True, slots=True)
class TimeLimits:
    """A tenant's job time limits in seconds: given to a job that names none (``default_s``), and the
    most a job may ask (``max_s``); None: none."""

    default_s: float | None = None
    max_s: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaTree:
    """Tenants as indices (pre-order) with per-flavor capacity arrays, derived once from a tenancy.

    ``path[i]`` lists the indices from tenant ``i`` up to its root. Per flavor: ``pool``,
    ``guaranteed`` and ``borrow_cap`` (``None`` = unlimited) as defined in the module docstring."""

    names: tuple[str, ...]
    index: Mapping[str, int]
    parent: tuple[int, ...]  # -1 for a root
    path: tuple[tuple[int, ...], ...]
    nominal: Mapping[str, tuple[int, ...]]
    pool: Mapping[str, tuple[int, ...]]
    guaranteed: Mapping[str, tuple[int, ...]]
    borrow_cap: Mapping[str, tuple[int | None, ...]]


@dataclass(frozen=True)
class Tenancy:
    """A validated tenancy file: tenants, flavors, priority classes, units and fair-share settings."""

    version: int
    tenants: Mapping[str, Tenant]  # pre-order: a parent before its children
    flavors: tuple[str, ...]
    priority_classes: Mapping[str, int]  # name -> value; a larger value goes first
    default_priority_class: str
    gpu_equivalents: Mapping[str, float]
    mig_slices_per_gpu: Mapping[str, int]
    half_life_s: float
    revision: int = 0  # bumped on every change; keep the newest revision seen (admin events may race)
    guest_tenant: str | None = None  # the leaf charged for tenants the file does not name (None: they wait)
    tree: QuotaTree = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.tree is None:
            object.__setattr__(self, "tree", build_tree(self.tenants, self.flavors))

    @cached_property
    def _preferred(self) -> Mapping[str, tuple[str, ...]]:
        """Each tenant's ``preferred_flavors``, worked out once: a quota cycle asks it for every waiting job."""
        return {name: self._flavors_for(name) for name in self.tenants}

    def leaves(self) -> tuple[str, ...]:
        return tuple(name for name, tenant in self.tenants.items() if tenant.is_leaf)

    def root_of(self, name: str) -> str:
        return self.tree.names[self.tree.path[self.tree.index[name]][-1]]

    def charged_tenant(self, tenant: str) -> str:
        """The leaf a tenant's jobs are charged to: itself, or the guest tenant for one the file does not
        name (itself again when there is no guest tenant: it is then refused as unknown)."""
        if tenant in self.tenants or self.guest_tenant is None:
            return tenant
        return self.guest_tenant

    def nominal_units(self, tenant: str, flavor: str) -> int:
        return self.tenants[tenant].flavor_quota(flavor).nominal

    def preferred_flavors(self, tenant: str) -> tuple[str, ...]:
        """Flavors to try for a job that allows any model: the tenant's own quota first, then the rest."""
        preferred = self._preferred.get(tenant)
        return preferred if preferred is not None else self._flavors_for(tenant)

    def _flavors_for(self, tenant: str) -> tuple[str, ...]:
        own = tuple(f for f in self.flavors if self.nominal_units(tenant, f) > 0)
        return own + tuple(f for f in self.flavors if f not in own)


def build_tree(tenants: Mapping[str, Tenant], flavors: tuple[str, ...]) -> QuotaTree:
    names = tuple(tenants)
    index = {name: i for i, name in enumerate(names)}
    parent = tuple(index[t.parent] if t.parent is not None else -1 for t in tenants.values())
    path = tuple(_path(i, parent) for i in range(len(names)))
    nominal, pool, guaranteed, cap = {}, {}, {}, {}
    for flavor in flavors:
        quotas = [t.flavor_quota(flavor) for t in tenants.values()]
        pools = [q.nominal for q in quotas]
        guar = [0] * len(names)
        for i in reversed(range(len(names))):  # children come after parents in pre-order
            limit = quotas[i].lending_limit
            guar[i] = max(0, pools[i] - limit) if limit is not None else 0
            if parent[i] >= 0:
                pools[parent[i]] += pools[i] - guar[i]
        nominal[flavor] = tuple(q.nominal for q in quotas)
        pool[flavor], guaranteed[flavor] = tuple(pools), tuple(guar)
        cap[flavor] = tuple(q.borrowing_limit for q in quotas)
    return QuotaTree(names, index, parent, path, nominal, pool, guaranteed, cap)


def _path(i: int, parent: tuple[int, ...]) -> tuple[int, ...]:
    out = [i]
    while parent[out[-1]] >= 0:
        out.append(parent[out[-1]])
    return tuple(out)
