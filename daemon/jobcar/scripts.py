"""The Lua scripts: each transition (`lua/<name>.lua`) and each fsck repair (`lua/repair/<kind>.lua`),
loaded with the helpers it names.

A script names the helpers it needs with lines of the form `--- @include "<helper>"`; each such line
is replaced by `lua/includes/<helper>.lua`, whose own `@include` lines are expanded first, and a
helper already inserted is skipped. A script's source stays one self-contained EVAL body, and it
carries only the helpers it calls: Redis runs a script's whole body on every call, so every helper it
carried would cost a closure per call. docs/protocol.md states the same rule for producers in other
languages.

Read through importlib.resources, so it also works when jobcar is imported from a zip file.
Standard library only: producers load the enqueue script.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final, TypeAlias

#: An argument of a script call, as redis-py sends it.
Arg: TypeAlias = bytes | str | int | float
#: A reply as redis-py returns it (clients are made with decode_responses=False: text is bytes).
Reply: TypeAlias = object

INCLUDE: Final = re.compile(r'^--- @include "([A-Za-z0-9_]+)"$', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call of a script: what `transport` sends as EVALSHA (or loads first, on NOSCRIPT)."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]

    def command(self) -> tuple[Arg, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def call(name: str, keys: Sequence[str], args: Sequence[Arg]) -> ScriptCall:
    return ScriptCall(script(name), tuple(keys), tuple(args))


@cache
def script(name: str) -> Script:
    """`lua/<name>.lua` (a name may hold a folder: "repair/no_ttl") with its includes expanded."""
    body = _read(*name.split("/"))
    if not body.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua must start with a #!lua shebang line")
    source = expand_includes(body, set())
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def expand_includes(text: str, included: set[str]) -> str:
    """`text` with each `--- @include "x"` line replaced by includes/x.lua, expanded the same way; a
    helper already in `included` is replaced by nothing (Lua locals: one definition is enough)."""

    def insert(match: re.Match[str]) -> str:
        helper = match.group(1)
        if helper in included:
            return ""
        included.add(helper)
        return expand_includes(_read("includes", f"{helper}").rstrip("\n"), included)

    return INCLUDE.sub(insert, text)


def _read(*parts: str) -> str:
    path = resources.files("jobcar") / "lua"
    for part in parts[:-1]:
        path = path / part
    return (path / f"{parts[-1]}.lua").read_text(encoding="utf-8")
