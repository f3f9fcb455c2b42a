"""The quota book: reserved usage per tenant and flavor on a quota tree, and what still fits.

A ``QuotaBook`` is the working copy a planning cycle charges tentatively; it is built from an
immutable usage mapping and never writes back into it. See ``model`` for the capacity rules.
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import QuotaTree, Tenancy

INFINITE = float("inf")


class QuotaBook:
    """Usage per flavor per tree node: a leaf's reserved units; an inner node's draw on its pool."""

    __slots__ = ("tenancy", "tree", "_used", "_ever")

    def __init__(self, tenancy: Tenancy, used: dict[str, list[int]],
                 ever: dict[tuple[str, str], float] | None = None) -> None:
        self.tenancy = tenancy
        self.tree: QuotaTree = tenancy.tree
        self._used = used
        self._ever = ever if ever is not None else {}  # memo of most_ever: a function of the tree only

    @classmethod
    def from_usage(cls, tenancy: Tenancy, usage: Mapping[str, Mapping[str, int]]) -> QuotaBook:
        """``usage``: reserved units per leaf tenant per flavor. Unknown tenants or flavors (a tenant
        removed from the file while its jobs still run) are ignored: they no longer share anything."""
        book = cls(tenancy, {f: [0] * len(tenancy.tree.names) for f in tenancy.flavors})
        for tenant, per_flavor in usage.items():
            if tenant not in book.tree.index:
                continue
            for flavor, units in per_flavor.items():
                if flavor in book._used and units:
                    book.charge(tenant, flavor, units)
        return book

    def copy(self) -> QuotaBook:
        return QuotaBook(self.tenancy, {f: list(u) for f, u in self._used.items()}, self._ever)

    def used(self, tenant: str, flavor: str) -> int:
        used = self._used.get(flavor)
        return used[self.tree.index[tenant]] if used is not None else 0

    def nominal(self, tenant: str, flavor: str) -> int:
        nominal = self.tree.nominal.get(flavor)
        return nominal[self.tree.index[tenant]] if nominal is not None else 0

    def borrowing_limit(self, tenant: str, flavor: str) -> int | None:
        caps = self.tree.borrow_cap.get(flavor)
        return caps[self.tree.index[tenant]] if caps is not None else 0

    def available(self, tenant: str, flavor: str) -> float:
        """Units ``tenant`` may still reserve of ``flavor`` (``inf`` never occurs below a root)."""
        used = self._used.get(flavor)
        if used is None:
            return 0
        tree = self.tree
        pool, guar, caps = tree.pool[flavor], tree.guaranteed[flavor], tree.borrow_cap[flavor]
        path = tree.path[tree.index[tenant]]
        root = path[-1]
        avail = pool[root] - used[root]
        for node in reversed(path[:-1]):
            g, u = guar[node], used[node]
            cap = caps[node]
            if cap is not None:
                avail = min(avail, pool[node] - g - (u - g if u > g else 0) + cap)
            avail = (g - u if g > u else 0) + (avail if avail > 0 else 0)
        return avail if avail > 0 else 0

    def charge(self, tenant: str, flavor: str, units: int) -> None:
        """Add (or, negative, release) ``units`` of a leaf's usage and propagate the draw on pools."""
        used = self._used[flavor]
        guar = self.tree.guaranteed[flavor]
        parent = self.tree.parent
        node, delta = self.tree.index[tenant], units
        while delta and node >= 0:
            before = used[node]
            after = before + delta
            used[node] = after
            g = guar[node]
            delta = (after - g if after > g else 0) - (before - g if before > g else 0)  # max(0, .) without calls
            node = parent[node]

    def borrowed(self, tenant: str, flavor: str) -> int:
        """Units a leaf holds above its nominal quota."""
        return max(0, self.used(tenant, flavor) - self.nominal(tenant, flavor))

    def cohort_members(self, tenant: str) -> tuple[str, ...]:
        """Leaves under the same root as ``tenant`` (itself included), in tree order."""
        tree = self.tree
        root = tree.path[tree.index[tenant]][-1]
        return tuple(tree.names[i] for i in range(len(tree.names))
                     if tree.path[i][-1] == root and self.tenancy.tenants[tree.names[i]].is_leaf)

    def most_ever(self, tenant: str, flavor: str) -> float:
        """The most ``tenant`` could ever hold of ``flavor`` (every other tenant idle)."""
        key = (tenant, flavor)
        if key not in self._ever:
            self._ever[key] = QuotaBook.from_usage(self.tenancy, {}).available(tenant, flavor)
        return self._ever[key]

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Leaf usage as a plain mapping (what the caller persists after committing reservations)."""
        out: dict[str, dict[str, int]] = {}
        for name in self.tenancy.leaves():
            row = {f: self.used(name, f) for f in self.tenancy.flavors if self.used(name, f)}
            if row:
                out[name] = row
        return out
