"""The Lua scripts: each transition (`lua/<name>.lua`) and each fsck repair (`lua/repair/<kind>.lua`),
loaded with the helpers it names.

A script names the helpers it needs with lines of the form `--- @include "<helper>"`; each such line
is replaced by `lua/includes/<helper>.lua`, whose own `@include` lines are expanded first, and a
helper already inserted is skipped. A script's source stays one self-contained EVAL body, and it
carries only the helpers it calls: Redis runs a script's whole body on every call, so every helper it
carried would cost a closure per call. docs/protocol.md states the same rule for producers in other
languages.

A helper written on one line, `local function <name>(<params>) return <expression> end` (the key names of
includes/keys.lua, the limit group names of includes/group_names.lua), is not carried but inlined: each
call is replaced by its expression, in parentheses, with its parameters replaced by the call's arguments.
A name built through it then costs what it cost written out by hand: no closure per call, no call.

Read through importlib.resources, so it also works when jobcar is imported from a zip file.
Standard library only: producers load the enqueue script.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import resources
from typing import Final, TypeAlias

#: An argument of a script call, as redis-py sends it.
Arg: TypeAlias = "bytes | str | int | float"
#: A reply as redis-py returns it (clients are made with decode_responses=False: text is bytes).
Reply: TypeAlias = object

INCLUDE: Final = re.compile(r'^--- @include "([A-Za-z0-9_]+)"$', re.MULTILINE)
ONE_LINER: Final = re.compile(r"^local function ([A-Za-z_]\w*)\(([\w, ]*)\) return (.+) end\n", re.MULTILINE)
#: A string literal of the scripts (none of them escapes its own quote), or a name.
_TOKEN: Final = re.compile(r"'[^']*'|\"[^\"]*\"|[A-Za-z_]\w*")
#: What a call's arguments are read as: string literals (whose brackets and commas are text), brackets, commas.
_CALL_TOKEN: Final = re.compile(r"'[^']*'|\"[^\"]*\"|[()\[\]{},]")
#: An argument that needs no parentheses to keep its meaning inside an expression: a name, maybe indexed.
_PLAIN: Final = re.compile(r"[\w.]+(\[[^\[\]]*\])*|'[^']*'")


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
    source = assemble(body)
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


def assemble(body: str) -> str:
    """A script's source: `body` with its helpers included and its one-line helpers inlined."""
    return inline_one_liners(expand_includes(body, set()))


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


def inline_one_liners(source: str) -> str:
    """`source` without its one-line helpers, each call of one replaced by the helper's expression."""
    helpers = {name: (params.replace(" ", "").split(","), body) for name, params, body in ONE_LINER.findall(source)}
    if not helpers:
        return source
    # Comments and string literals are passed over whole: a call is code.
    calls = re.compile(r"--[^\n]*|'[^']*'|\"[^\"]*\"|(?<![\w.:])(" + "|".join(helpers) + r")\(")

    def inline(text: str) -> str:
        parts: list[str] = []
        done = 0
        for match in calls.finditer(text):
            if match[1] is None or match.start() < done:
                continue
            args, end = _arguments(text, match.end())
            params, body = helpers[match[1]]
            if len(args) != len(params):
                raise RuntimeError(f"{match[1]} takes {len(params)} arguments, got {args}")
            bound = {p: a if _PLAIN.fullmatch(a) else f"({a})" for p, a in zip(params, map(inline, args), strict=True)}
            expression = inline(_TOKEN.sub(partial(_bound, bound), body))
            parts += [text[done : match.start()], f"({expression})"]
            done = end
        return "".join(parts) + text[done:]

    return inline(ONE_LINER.sub("", source))


def _bound(bound: dict[str, str], token: re.Match[str]) -> str:
    return bound.get(token[0], token[0])


def _arguments(text: str, start: int) -> tuple[list[str], int]:
    """The arguments of the call whose "(" ends at `start`, split at its own commas, and the index past its ")"."""
    args: list[str] = []
    depth, at = 0, start
    for token in _CALL_TOKEN.finditer(text, start):
        if token[0] in ("(", "[", "{"):
            depth += 1
        elif token[0] in (")", "]", "}") and depth > 0:
            depth -= 1
        elif token[0] == ")" or (token[0] == "," and depth == 0):
            args.append(text[at : token.start()].strip())
            at = token.end()
            if token[0] == ")":
                return ([] if args == [""] else args), at
    raise RuntimeError(f"a call without its end: {text[start - 20 : start + 20]!r}")


def _read(*parts: str) -> str:
    path = resources.files("jobcar") / "lua"
    for part in parts[:-1]:
        path = path / part
    return (path / f"{parts[-1]}.lua").read_text(encoding="utf-8")
