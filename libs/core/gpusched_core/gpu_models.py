"""Which GPU model a request means, and whether this cluster has it (pure).

A requested name (a canonical name, an NVML product name, a GPU feature discovery label value, or an alias
from the operator's catalogue) is read by rule (``gpusched_common.resources.canonical_model``) and resolved
against a ``ModelView``: the models registered nodes report (with the largest memory a GPU of each
reports) and the models an operator declared before any node has them (the tenancy's flavors, the
catalogue's models). A name without a memory class (``B200``, ``NVIDIA-L40S``, ``NVIDIA-GH200-480GB``)
resolves to the one model of its family and form factor the view has. Nothing else is accepted: a
refusal lists the models the cluster has.

The operator's catalogue (``load_catalogue``: a YAML document the shell reads from GPUSCHED_GPU_CATALOGUE)
gives models aliases (a site's name, a label spelling the rule reads otherwise) and display names::

    models:
      - name: A100-80GB                 # a canonical name (what the rule gives it)
        display: NVIDIA A100 80GB SXM4
        aliases: [NVIDIA-A100-80GB-HBM2e, site-a100]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import yaml

from gpusched_common.resources import canonical_model, model_memory_class_mib, parse_gpu_name, strip_gfd_suffix

MAX_CATALOGUE_MODELS = 1000
MAX_ALIASES = 64
MAX_DISPLAY_CHARS = 80
MAX_LISTED = 20  # models named in a refusal


class CatalogueError(ValueError):
    """A catalogue that cannot be used, with every problem found."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__(f"GPU catalogue {source}: " + "; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class CatalogueModel:
    name: str
    display: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Catalogue:
    """The operator's models: aliases to canonical names, and display names (empty: the rule alone)."""

    models: tuple[CatalogueModel, ...] = ()
    _aliases: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        table = {_key(alias): m.name for m in self.models for alias in (m.name, *m.aliases)}
        object.__setattr__(self, "_aliases", MappingProxyType(table))

    def canonical(self, name: str, memory_mib: int | None = None) -> str | None:
        """An alias's model, else the rule's (``canonical_model``); None: no model name."""
        return (self._aliases.get(_key(name)) or self._aliases.get(_key(strip_gfd_suffix(name)))
                or canonical_model(name, memory_mib))

    def display(self, name: str) -> str | None:
        return next((m.display for m in self.models if m.name == name), None)

    def describe(self, name: str) -> str:
        shown = self.display(name)
        return f"{name} ({shown})" if shown else name


def _key(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("-", " ").split()).lower()


def load_catalogue(text: str, source: str = "<text>") -> Catalogue:
    """The catalogue a YAML document describes; raises ``CatalogueError`` naming every problem."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogueError(source, [f"is not YAML: {str(exc).splitlines()[0]}"]) from None
    if doc is None:
        return Catalogue()
    if not isinstance(doc, dict) or set(doc) - {"models"}:
        raise CatalogueError(source, ["must be a mapping with one key, models (a list of models)"])
    entries = doc.get("models") or []
    if not isinstance(entries, list):
        raise CatalogueError(source, ["models must be a list"])
    if len(entries) > MAX_CATALOGUE_MODELS:
        raise CatalogueError(source, [f"has {len(entries)} models; at most {MAX_CATALOGUE_MODELS}"])
    problems: list[str] = []
    models: list[CatalogueModel] = []
    claimed: dict[str, str] = {}
    for position, entry in enumerate(entries, 1):
        model = _entry(entry, f"models[{position}]", problems)
        if model is None:
            continue
        if any(m.name == model.name for m in models):
            problems.append(f"models[{position}]: {model.name} is described twice")
            continue
        for alias in (model.name, *model.aliases):
            owner = claimed.setdefault(_key(alias), model.name)
            if owner != model.name:
                problems.append(f"models[{position}]: alias {alias!r} is already {owner}'s")
        models.append(model)
    if problems:
        raise CatalogueError(source, problems)
    return Catalogue(tuple(models))


def _entry(entry: object, where: str, problems: list[str]) -> CatalogueModel | None:
    if not isinstance(entry, dict):
        problems.append(f"{where}: a model is a mapping of name, display and aliases")
        return None
    unknown = sorted(str(k) for k in set(entry) - {"name", "display", "aliases"})
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)} (a model has name, display, aliases)")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"{where}: name must be a canonical model name such as H100-80GB")
        return None
    ruled = canonical_model(name)
    if ruled is None:
        problems.append(f"{where}: {name!r} is no GPU model name (e.g. H100-80GB, A100-PCIE-40GB, B200-180GB)")
        return None
    if ruled != name:
        problems.append(f"{where}: name {name!r} is not canonical: write {ruled!r}")
        return None
    if model_memory_class_mib(name) is None:
        problems.append(f"{where}: name {name!r} has no memory class: write it with one, e.g. {name}-80GB")
        return None
    display = entry.get("display")
    if display is not None and (not isinstance(display, str) or not 0 < len(display.strip()) <= MAX_DISPLAY_CHARS):
        problems.append(f"{where}: display must be text of 1..{MAX_DISPLAY_CHARS} characters")
        display = None
    aliases = entry.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        problems.append(f"{where}: aliases must be a list of names")
        aliases = []
    elif len(aliases) > MAX_ALIASES:
        problems.append(f"{where}: {len(aliases)} aliases; at most {MAX_ALIASES}")
        aliases = []
    return CatalogueModel(name, display.strip() if isinstance(display, str) else None,
                          tuple(a.strip() for a in aliases))


@dataclass(frozen=True)
class ModelView:
    """What admission knows of the cluster's models: ``present`` (each model registered nodes report, as
    they report it, with the largest memory one of its GPUs reports, MiB), ``declared`` (models accepted
    before a node has them: the tenancy's flavors, the catalogue's models) and the catalogue."""

    present: Mapping[str, int] = field(default_factory=dict)
    declared: tuple[str, ...] = ()
    catalogue: Catalogue = field(default_factory=Catalogue)

    def with_declared(self, names: Iterable[str]) -> ModelView:
        extra = tuple(n for n in names if n not in self.declared)
        return self if not extra else ModelView(self.present, self.declared + extra, self.catalogue)

    def resolve(self, requested: str) -> str | Refusal:
        """The model a request names, as the cluster spells it (what placement matches), or why not."""
        wanted = self.catalogue.canonical(requested)
        if wanted is None:
            return Refusal(f"unknown GPU model {requested!r}: it is no GPU model name "
                           "(e.g. H100-80GB, NVIDIA A100-SXM4-80GB, NVIDIA-L40S)")
        present = {name: self.catalogue.canonical(name, memory) or name for name, memory in self.present.items()}
        declared = {name: self.catalogue.canonical(name) or name for name in self.declared if name not in present}
        for known in (present, declared):
            exact = sorted(name for name, canonical in known.items() if canonical == wanted)
            if exact:
                return exact[0]
        parsed = parse_gpu_name(wanted)
        if parsed is not None and parsed.memory_gb is None:  # e.g. B200, or GH200 of a module's 480GB
            for known in (present, declared):
                kinds = sorted({c for n, c in known.items() if _kind(c) == _kind(wanted)})
                if len(kinds) == 1:
                    return next(n for n, c in sorted(known.items()) if c == kinds[0])
                if len(kinds) > 1:
                    return Refusal(f"GPU model {requested!r} is ambiguous here: name one of {', '.join(kinds)}")
        return Refusal(f"unknown GPU model {requested!r}: no registered node has {wanted}" + self._listing())

    def _listing(self) -> str:
        if not self.present and not self.declared:
            return " (no node has registered a GPU yet)"
        names = sorted(set(self.present) | set(self.declared))
        shown = ", ".join(self.catalogue.describe(n) for n in names[:MAX_LISTED])
        more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
        return f" (the cluster has: {shown}{more})"

    def memory_mib(self, model: str | None) -> int | None:
        """The memory one GPU of ``model`` has: the largest registered (a node's inventory), else the
        name's class for a declared model; for no model, the largest of any (None: nothing known)."""
        if model is None:
            sizes = [*self.present.values(), *(model_memory_class_mib(n) or 0 for n in self.declared)]
            return max(sizes) if any(sizes) else None
        if model in self.present:
            return self.present[model]
        return model_memory_class_mib(model)


@dataclass(frozen=True)
class Refusal:
    reason: str


def _kind(name: str) -> tuple[str, str | None] | None:
    parsed = parse_gpu_name(name)
    return parsed.kind if parsed is not None else None

