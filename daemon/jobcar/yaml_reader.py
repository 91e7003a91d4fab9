"""Turn a YAML node tree into values, keeping file:line:col for every error and collecting all of them.

PyYAML's composed nodes keep their position in the file, unlike the Python objects it would construct.
A `Reader` walks those nodes on behalf of the converters in config.py: it interpolates scalars from the
environment, lists a mapping's entries (expanding `<<` merges, reporting duplicate and unknown keys) and
runs a table of converters over them. A converter that cannot use a value raises `Invalid`; the reader
records the message with the node's position and key path and carries on, so that every problem in the
file is reported at once, in file order, as `file:line:col key.path: message`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, NamedTuple

import yaml

from jobcar.targets import did_you_mean
from jobcar.units import interpolate

__all__ = [
    "Converter",
    "Entry",
    "Invalid",
    "KeyPath",
    "Reader",
    "is_null",
    "line_col",
    "syntax_error",
]

_NULL_TAG: Final = "tag:yaml.org,2002:null"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"

KeyPath = tuple[str, ...]


class Invalid(Exception):
    """A value that cannot be used; whoever catches it knows the node and key path to report."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Entry(NamedTuple):
    key: yaml.Node
    value: yaml.Node


#: Reads one value: returns it converted, raises Invalid, or reports problems inside it with reader.error.
Converter = Callable[["Reader", yaml.Node, KeyPath], Any]


class Reader:
    """Walks the node tree, collecting problems instead of stopping at the first one."""

    def __init__(self, source: str, environ: Mapping[str, str], *, secrets_needed: bool = True) -> None:
        self.source = source
        self.environ = environ
        #: False for the commands that never run a handler: a secret's unset variable is then no error.
        self.secrets_needed = secrets_needed
        self.problems: dict[str, tuple[int, int]] = {}  # message -> position; a dict drops repeats
        self._expanding: set[int] = set()  # mappings whose `<<` merges are being expanded

    def error(self, node: yaml.Node, path: KeyPath, message: str) -> None:
        line, col = node.start_mark.line + 1, node.start_mark.column + 1
        where = f"{self.source}:{line}:{col}"
        self.problems.setdefault(f"{where} {_render(path)}: {message}" if path else f"{where}: {message}", (line, col))

    def messages(self) -> list[str]:
        return sorted(self.problems, key=self.problems.__getitem__)

    def scalar(self, node: yaml.Node, what: str) -> str | None:
        """The interpolated text of a scalar, or None for YAML null (`~`, `null` or nothing at all)."""
        if not isinstance(node, yaml.ScalarNode):
            raise Invalid(f"must be {what}, not {_kind(node)}")
        if node.tag == _NULL_TAG:
            return None
        try:
            return interpolate(str(node.value), self.environ)
        except ValueError as exc:
            raise Invalid(str(exc)) from None

    def secret(self, node: yaml.Node, what: str) -> str | None:
        """`scalar` for a value only handlers use (a header, a signing secret, a handler's environment).
        Unless secrets are needed, a variable that is unset there reads as empty instead of failing."""
        if self.secrets_needed:
            return self.scalar(node, what)
        if isinstance(node, yaml.ScalarNode) and node.tag != _NULL_TAG:
            with contextlib.suppress(ValueError):
                return interpolate(str(node.value), self.environ)
            return ""
        return self.scalar(node, what)

    def text(self, node: yaml.Node, what: str) -> str:
        text = self.scalar(node, what)
        if text is None:
            raise Invalid(f"must be {what}, not empty")
        return text

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if is_null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise Invalid(f"must be {what}, not {_kind(node)}")
        return list(node.value)

    def entries(
        self, node: yaml.Node, path: KeyPath, known: Collection[str] | None = None, what: str = "a mapping"
    ) -> dict[str, Entry]:
        """The keys of a mapping, after reporting duplicate ones and, when `known` is given, unknown ones."""
        if is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise Invalid(f"must be {what}, not {_kind(node)}")
        own: dict[str, Entry] = {}
        merged: dict[str, Entry] = {}
        self._expanding.add(id(node))
        try:
            for key, value in node.value:
                if key.tag == _MERGE_TAG:
                    for name, entry in self._merged(value, path).items():
                        merged.setdefault(name, entry)
                elif not isinstance(key, yaml.ScalarNode):
                    self.error(key, path, f"keys must be strings, not {_kind(key)}")
                elif str(key.value) in own:
                    first = own[str(key.value)].key.start_mark.line + 1
                    self.error(key, (*path, str(key.value)), f"duplicate key (first defined on line {first})")
                else:
                    own[str(key.value)] = Entry(key, value)
        finally:
            self._expanding.discard(id(node))
        entries = {**merged, **own}  # keys written in the mapping win over merged ones, as in YAML
        if known is not None:
            self.reject_unknown(entries, path, known)
        return entries

    def _merged(self, node: yaml.Node, path: KeyPath) -> dict[str, Entry]:
        """The entries a `<<: *anchor` (or `<<: [*a, *b]`, earlier ones winning) merges into a mapping."""
        merged: dict[str, Entry] = {}
        for source in node.value if isinstance(node, yaml.SequenceNode) else [node]:
            if not isinstance(source, yaml.MappingNode):
                self.error(source, path, "'<<' must be followed by a mapping or a list of mappings")
            elif id(source) in self._expanding:
                self.error(source, path, "'<<' merges a mapping into itself")
            else:
                for name, entry in self.entries(source, path).items():
                    merged.setdefault(name, entry)
        return merged

    def reject_unknown(
        self,
        entries: Mapping[str, Entry],
        path: KeyPath,
        known: Collection[str],
        foreign: Mapping[str, str] | None = None,
    ) -> None:
        """Report each key not in `known`; `foreign` gives a better message for keys of another kind."""
        for name, entry in entries.items():
            if name not in known:
                hint = (foreign or {}).get(name) or "unknown key" + did_you_mean(name, known)
                self.error(entry.key, (*path, name), hint)

    def fields(self, entries: Mapping[str, Entry], path: KeyPath, table: Mapping[str, Converter]) -> dict[str, Any]:
        """Convert each present key with its converter from `table`; the result holds the ones that worked."""
        values: dict[str, Any] = {}
        for name, convert in table.items():
            entry = entries.get(name)
            if entry is None:
                continue
            try:
                values[name] = convert(self, entry.value, (*path, name))
            except Invalid as exc:
                self.error(entry.value, (*path, name), exc.message)
        return values


def _render(path: KeyPath) -> str:
    # Handler type names contain dots ("email.welcome"); joining with '.' anyway reads naturally.
    return "".join(part if part.startswith("[") else "." + part for part in path).lstrip(".")


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return "empty" if node.tag == _NULL_TAG else repr(str(node.value))


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def line_col(text: str, position: int) -> tuple[int, int]:
    return text.count("\n", 0, position) + 1, position - (text.rfind("\n", 0, position) + 1) + 1


def syntax_error(source: str, exc: yaml.MarkedYAMLError) -> str:
    message = exc.problem or exc.context or "invalid YAML"
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return f"{source}: {message}"
    if exc.problem and exc.context:
        at = exc.context_mark
        if at is None or (at.line, at.column) == (mark.line, mark.column):
            message += f" ({exc.context})"
        else:
            message += f" ({exc.context} at line {at.line + 1}, column {at.column + 1})"
    return f"{source}:{mark.line + 1}:{mark.column + 1}: {message}"
