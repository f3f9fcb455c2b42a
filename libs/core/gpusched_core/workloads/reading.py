"""Reading one document (pure): typed access to its values by field path, collecting every problem and
warning with the path it is about (``spec.containers[0].resources.limits: expected a mapping, got a
list``), so that one document's reasons are all said at once and a wrong type is never a traceback."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def at(path: str, key: str | int) -> str:
    """``spec.containers`` + 0 -> ``spec.containers[0]``; a key with dots or slashes is quoted:
    ``limits["nvidia.com/gpu"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.match(key):
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, date):
        return "a date"
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "null",
            bytes: "binary data"}.get(type(value), type(value).__name__)


@dataclass
class Doc:
    """What reading a document found: its problems (it is refused when it has any) and its warnings
    (what it asks for that gpusched reads but does not do)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def problem(self, path: str, text: str) -> None:
        self.problems.append(f"{path}: {text}" if path else text)

    def warn(self, path: str, text: str) -> None:
        line = f"{path}: {text}" if path else text
        if line not in self.warnings:
            self.warnings.append(line)

    def wrong(self, path: str, expected: str, value: object) -> None:
        hint = ' (quote it: "...")' if expected == "a string" and isinstance(value, bool | int | float | date) else ""
        self.problem(path, f"expected {expected}, got {type_name(value)}{hint}")

    def mapping(self, parent: dict[str, Any], key: str, path: str, *, required: bool = False) -> dict[str, Any]:
        """``parent[key]`` as a mapping ({} when absent or null, or when it is of another type: a problem)."""
        value = parent.get(key)
        where = at(path, key)
        if value is None:
            if required:
                self.problem(where, "missing")
            return {}
        if not isinstance(value, dict):
            self.wrong(where, "a mapping", value)
            return {}
        return value

    def sequence(self, parent: dict[str, Any], key: str, path: str, *, required: bool = False) -> list[Any]:
        value = parent.get(key)
        where = at(path, key)
        if value is None:
            if required:
                self.problem(where, "missing")
            return []
        if not isinstance(value, list):
            self.wrong(where, "a list", value)
            return []
        return value

    def items(self, parent: dict[str, Any], key: str, path: str, *, required: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """The mappings of a list, each with its path (an item of another type: a problem)."""
        out = []
        for index, item in enumerate(self.sequence(parent, key, path, required=required)):
            where = at(at(path, key), index)
            if isinstance(item, dict):
                out.append((where, item))
            else:
                self.wrong(where, "a mapping", item)
        return out

    def string(self, parent: dict[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
        value = parent.get(key)
        if value is None:
            if required:
                self.problem(at(path, key), "missing")
            return None
        if not isinstance(value, str):
            self.wrong(at(path, key), "a string", value)
            return None
        return value

    def strings(self, parent: dict[str, Any], key: str, path: str) -> list[str]:
        out = []
        for index, item in enumerate(self.sequence(parent, key, path)):
            if isinstance(item, str):
                out.append(item)
            else:
                self.wrong(at(at(path, key), index), "a string", item)
        return out

    def labels(self, parent: dict[str, Any], key: str, path: str) -> dict[str, str]:
        """A mapping of strings to strings (a node selector, annotations)."""
        out = {}
        for name, value in self.mapping(parent, key, path).items():
            if not isinstance(name, str):
                self.wrong(at(path, key), "string keys", name)
            elif isinstance(value, str):
                out[name] = value
            else:
                self.wrong(at(at(path, key), name), "a string", value)
        return out

    def integer(self, parent: dict[str, Any], key: str, path: str, *, minimum: int = 0,
                default: int | None = None) -> int | None:
        value = parent.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.wrong(at(path, key), "an integer", value)
            return default
        if value < minimum:
            self.problem(at(path, key), f"must be at least {minimum}, got {value}")
            return default
        return value

    def seconds(self, parent: dict[str, Any], key: str, path: str) -> float | None:
        """A positive number of seconds (``activeDeadlineSeconds``)."""
        value = parent.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            self.problem(at(path, key), f"must be a positive number of seconds, got {value!r}")
            return None
        return float(value)

    def flag(self, parent: dict[str, Any], key: str, path: str) -> bool:
        value = parent.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            self.wrong(at(path, key), "true or false", value)
            return False
        return value

    def rest(self, obj: dict[str, Any], path: str, read: frozenset[str] | set[str], ignored: dict[str, str],
             refused: dict[str, str] | None = None, what: str = "field") -> None:
        """Warn of every key of ``obj`` that is not read (``ignored`` says why), refuse those in ``refused``;
        a key known to neither: ``ignored: not a <what> gpusched reads``."""
        for key, value in obj.items():
            if not isinstance(key, str):
                self.problem(path, f"key {key!r} is not a string")
            elif key in read:
                continue
            elif refused and key in refused:
                self.problem(at(path, key), f"not supported: {refused[key]}")
            elif value in (None, [], {}, False):
                continue  # an empty value asks for nothing
            else:
                self.warn(at(path, key), f"ignored: {ignored.get(key, f'not a {what} gpusched reads')}")
