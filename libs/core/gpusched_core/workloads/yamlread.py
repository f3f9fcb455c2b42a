"""A strict YAML reader for workload files (pure): the documents of a file as plain values, or every
reason it cannot be read, each with its line. Bounded: at most ``MAX_BYTES`` of UTF-8 text, values nested
at most ``MAX_DEPTH`` deep, ``MAX_DOCUMENTS`` documents, ``MAX_VALUES`` keys and values. Refused: a key given twice in one mapping (both
lines named), aliases (``*name``: an alias bomb is a few lines that expand to billions of values; a
workload file needs none), merge keys (``<<``), keys that are not plain values, and tags YAML's safe
schema does not know. Empty documents are skipped; each document keeps its number in the file."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 64
MAX_DOCUMENTS = 1000
MAX_VALUES = 100_000  # keys and values of the whole file: what a pure-Python parse does in a second or two
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblem(ValueError):
    """A file that is no YAML this reader takes; ``document`` is its number (1-based) when known."""

    def __init__(self, message: str, document: int | None = None) -> None:
        super().__init__(message)
        self.document = document


class _Refused(yaml.MarkedYAMLError):
    def __init__(self, mark: yaml.Mark, problem: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases, nesting beyond ``MAX_DEPTH``, duplicate and complex keys."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(event.start_mark, f"alias *{event.anchor}: anchors and aliases are not supported "
                                             "(write the value out where it is used)")
        self._depth += 1
        self._values += 1
        try:
            if self._values > MAX_VALUES:
                raise _Refused(self.peek_event().start_mark, f"more than {MAX_VALUES:,} keys and values in the file")
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"values nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    raise _Refused(key_node.start_mark, "merge keys (<<) are not supported (write the keys out)")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise _Refused(key_node.start_mark, "a mapping key must be a plain value, not a list or a mapping")
                key = self.construct_object(key_node)
                if key in first_line:
                    raise _Refused(key_node.start_mark, f"duplicate key {key!r} (first at line {first_line[key]})")
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def decode(data: str | bytes) -> str:
    """The text of a file, bounded; YamlProblem when it is too large or not UTF-8."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlProblem(f"the file is {size:,} bytes; a workload file holds at most {MAX_BYTES:,} (1 MiB)")
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlProblem(f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line})") from None


def documents(data: str | bytes) -> Iterator[tuple[int, Any]]:
    """(number, value) of each non-empty document, in order; YamlProblem (with the line) on the first
    thing that cannot be read."""
    text = decode(data)
    try:
        loader = _StrictLoader(text)
    except yaml.YAMLError as exc:
        raise YamlProblem(_describe(exc), 1) from None
    number = 0
    try:
        while loader.check_node():
            number += 1
            if number > MAX_DOCUMENTS:
                raise YamlProblem(f"the file has more than {MAX_DOCUMENTS} documents", number)
            node = loader.get_node()
            value = loader.construct_document(node) if node is not None else None
            if value is not None:
                yield number, value
    except yaml.YAMLError as exc:
        raise YamlProblem(_describe(exc), max(number, 1)) from None
    except RecursionError:  # not reached within MAX_DEPTH; a last guard, never a traceback
        raise YamlProblem("values nested too deep", max(number, 1)) from None
    finally:
        loader.dispose()


def _describe(exc: yaml.YAMLError) -> str:
    """``line 3, column 5: found duplicate key 'image' (first at line 2)``."""
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        return f"not YAML text: character U+{char:04X} at offset {exc.position} is not allowed"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "not valid YAML"
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{problem}{context}"
    return f"not valid YAML: {exc}"
