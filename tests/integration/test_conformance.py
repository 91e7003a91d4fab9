"""The producer conformance cases of docs/conformance/producer.json, run against the real server the way a
producer in another language runs them (docs/protocol.md, "Conformance cases"): raw SCRIPT LOAD and EVALSHA of
the assembled scripts and raw commands, never the Python client. Also the script assembly rule of
docs/protocol.md, implemented here on its own, against jobcar's loader and the SHAs the file carries."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import jobcar
from jobcar import scripts
from tests.servers import RedisServer

CONFORMANCE = Path(__file__).parents[2] / "docs" / "conformance" / "producer.json"
LUA = Path(jobcar.__file__).parent / "lua"
DOCUMENT: dict[str, Any] = json.loads(CONFORMANCE.read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DOCUMENT["cases"]

# --- the assembly rule of docs/protocol.md ("Assembling a script"), written without scripts.py ---------------

INCLUDE_LINE = re.compile(r'--- @include "([A-Za-z0-9_]+)"')
ONE_LINE_HELPER = re.compile(r"local function ([A-Za-z_]\w*)\(([\w, ]*)\) return (.+) end")
PLAIN_ARGUMENT = re.compile(r"[\w.]+(\[[^\[\]]*\])*|'[^']*'")


def documented_source(name: str) -> str:
    included: set[str] = set()

    def expand(text: str) -> str:
        lines = []
        for line in text.split("\n"):
            match = INCLUDE_LINE.fullmatch(line)
            if match is None:
                lines.append(line)
            elif match[1] in included:
                lines.append("")
            else:
                included.add(match[1])
                lines.append(expand((LUA / "includes" / f"{match[1]}.lua").read_text("utf-8").rstrip("\n")))
        return "\n".join(lines)

    return inline((LUA / f"{name}.lua").read_text("utf-8"), expand)


def inline(body: str, expand: Callable[[str], str]) -> str:
    text = expand(body)
    lines = text.split("\n")
    helpers: dict[str, tuple[list[str], str]] = {}
    kept = []
    for index, line in enumerate(lines):
        match = ONE_LINE_HELPER.fullmatch(line)
        if match and index < len(lines) - 1:  # a helper's line ends with a line break
            helpers[match[1]] = ([p for p in match[2].replace(" ", "").split(",")], match[3])
        else:
            kept.append(line)
    if not helpers:
        return text
    return replace_calls("\n".join(kept), helpers)


def replace_calls(text: str, helpers: dict[str, tuple[list[str], str]]) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            out.append(text[i:end])
            i = end
        elif c in "'\"":
            end = text.index(c, i + 1) + 1
            out.append(text[i:end])
            i = end
        elif c.isalpha() or c == "_":
            end = i
            while end < len(text) and (text[end].isalnum() or text[end] == "_"):
                end += 1
            name = text[i:end]
            before = text[i - 1] if i > 0 else ""
            if name in helpers and text[end : end + 1] == "(" and before not in ".:":
                args, after = split_arguments(text, end + 1)
                params, expression = helpers[name]
                assert len(args) == len(params), (name, args)
                bound = {}
                for param, arg in zip(params, args, strict=True):
                    arg = replace_calls(arg, helpers)
                    bound[param] = arg if PLAIN_ARGUMENT.fullmatch(arg) else f"({arg})"
                out.append(f"({replace_calls(substitute(expression, bound), helpers)})")
                i = after
            else:
                out.append(name)
                i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def substitute(expression: str, bound: dict[str, str]) -> str:
    """`expression` with each name (outside string literals) that is a parameter replaced by its argument."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|[A-Za-z_]\w*", lambda m: bound.get(m[0], m[0]), expression)


def split_arguments(text: str, start: int) -> tuple[list[str], int]:
    args, depth, at, i = [], 0, start, start
    while True:
        c = text[i]
        if c in "'\"":
            i = text.index(c, i + 1) + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}" and depth > 0:
            depth -= 1
        elif c == ")" or (c == "," and depth == 0):
            args.append(text[at:i].strip())
            at = i + 1
            if c == ")":
                return ([] if args == [""] else args), i + 1
        i += 1


def all_script_names() -> list[str]:
    return sorted(str(p.relative_to(LUA).with_suffix("")) for p in LUA.rglob("*.lua") if p.parent.name != "includes")


@pytest.mark.parametrize("name", all_script_names())
def test_the_documented_assembly_gives_the_loaders_source_and_sha(name: str) -> None:
    source = documented_source(name)
    assert source.startswith("#!lua")
    assert source == scripts.script(name).source
    assert hashlib.sha1(source.encode("utf-8")).hexdigest() == scripts.script(name).sha


@pytest.mark.parametrize("name", sorted(DOCUMENT["scripts"]))
def test_the_conformance_file_carries_each_scripts_sha(name: str) -> None:
    assert DOCUMENT["scripts"][name] == scripts.script(name).sha, (
        f"docs/conformance/producer.json holds an old SHA of {name}: write {scripts.script(name).sha} there"
    )


def test_the_cases_call_only_the_scripts_whose_sha_the_file_carries() -> None:
    called = {step["call"] for case in CASES for step in case["steps"] if "call" in step}
    assert called == set(DOCUMENT["scripts"])
    assert len({case["name"] for case in CASES}) == len(CASES)


# --- the runner: what docs/protocol.md asks of another implementation ----------------------------------------

PLACEHOLDER = re.compile(r"\$\{(ns|now|ms|any)([+-]\d+)?\}")


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client that hands every reply back as the server sent it (no redis-py reply callbacks)."""
    with redis_server.client(decode_responses=False) as client:
        client.response_callbacks.clear()
        yield client


class Run:
    """One case's placeholders: the namespace, and the Redis times read before its first step and after its
    last (`${now}` in an expectation is a time between the two)."""

    def __init__(self, raw: redis.Redis, ns: str) -> None:
        self.raw, self.ns = raw, ns
        self.first = self.last = self.redis_ms()

    def redis_ms(self) -> int:
        seconds, micros = send(self.raw, "TIME")
        return int(seconds) * 1000 + int(micros) // 1000

    def fill(self, text: str, now: int) -> str:
        """An argument: `${ns}`, `${now}` (Redis time just before the step) and `${now+N}` filled in."""

        def value(m: re.Match[str]) -> str:
            if m[1] == "ns":
                return self.ns
            assert m[1] == "now", f"{m[0]} in an argument"
            return str(now + int(m[2] or 0))

        return PLACEHOLDER.sub(value, text)

    def matches(self, expected: Any, actual: Any) -> bool:
        if isinstance(expected, dict) and "json" in expected:
            try:
                parsed = json.loads(actual)
            except (TypeError, ValueError):
                return False
            return self.matches_json(expected["json"], parsed)
        if isinstance(expected, dict) and "error" in expected:
            return isinstance(actual, Refusal) and self.matches_text(expected["error"], actual.text)
        if isinstance(expected, list):
            return (
                isinstance(actual, list)
                and len(actual) == len(expected)
                and all(self.matches(e, a) for e, a in zip(expected, actual, strict=True))
            )
        if isinstance(expected, str):
            return isinstance(actual, str) and self.matches_text(expected, actual)
        return type(expected) is type(actual) and expected == actual

    def matches_json(self, expected: Any, actual: Any) -> bool:
        if isinstance(expected, dict):
            return (
                isinstance(actual, dict)
                and expected.keys() == actual.keys()
                and all(self.matches_json(v, actual[k]) for k, v in expected.items())
            )
        if isinstance(expected, list):
            return (
                isinstance(actual, list)
                and len(actual) == len(expected)
                and all(self.matches_json(e, a) for e, a in zip(expected, actual, strict=True))
            )
        if isinstance(expected, str) and isinstance(actual, int) and not isinstance(actual, bool):
            return self.matches_text(expected, str(actual))
        return expected == actual if not isinstance(expected, str) else self.matches_text(expected, actual)

    def matches_text(self, expected: str, actual: object) -> bool:
        if not isinstance(actual, str):
            return False
        pattern, at = [], 0
        for m in PLACEHOLDER.finditer(expected):
            pattern.append(re.escape(expected[at : m.start()]))
            pattern.append({"ns": re.escape(self.ns), "any": "(?s:.*)"}.get(m[1], r"(-?\d+)"))
            at = m.end()
        pattern.append(re.escape(expected[at:]))
        found = re.fullmatch("".join(pattern), actual)
        if found is None:
            return False
        times = [m for m in PLACEHOLDER.finditer(expected) if m[1] in ("now", "ms")]
        for m, number in zip(times, [g for g in found.groups()], strict=True):
            n = int(number)
            if m[1] == "ms" and n < 0:
                return False
            if m[1] == "now" and not self.first + int(m[2] or 0) <= n <= self.last + int(m[2] or 0):
                return False
        return True


class Refusal:
    """An error reply, as the server wrote it (without its "-")."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Refusal({self.text!r})"


def decoded(reply: Any) -> Any:
    if isinstance(reply, bytes):
        return reply.decode("utf-8")
    if isinstance(reply, list):
        return [decoded(r) for r in reply]
    if isinstance(reply, dict):
        return {decoded(k): decoded(v) for k, v in reply.items()}
    return reply


def error_text(error: redis.ResponseError) -> str:
    """redis-py drops the code "ERR " of an error reply and keeps any other code: put it back."""
    text = str(error)
    code = text.split(" ", 1)[0]
    return text if code.isupper() and code.isalpha() else f"ERR {text}"


def send(raw: redis.Redis, *command: str) -> Any:
    try:
        return decoded(raw.execute_command(*command))
    except redis.ResponseError as error:
        return Refusal(error_text(error))


def key_state(raw: redis.Redis, key: str) -> dict[str, Any]:
    kind = send(raw, "TYPE", key)
    state: dict[str, Any] = {"type": kind}
    read = {
        "hash": ("HGETALL",),
        "list": ("LRANGE", "0", "-1"),
        "set": ("SMEMBERS",),
        "zset": ("ZRANGE", "0", "-1", "WITHSCORES"),
    }
    command, *rest = read.get(kind, ("GET",))
    value = send(raw, command, key, *rest)
    if kind == "hash" and isinstance(value, list):  # RESP2 gives a flat array, RESP3 a map
        value = dict(zip(value[::2], value[1::2], strict=True))
    elif kind == "set":
        value = sorted(value, key=lambda s: s.encode())
    elif kind == "zset":
        pairs = value if value and isinstance(value[0], list) else zip(value[::2], value[1::2], strict=True)
        value = [[member, str(int(float(score)))] for member, score in pairs]
    state["value"] = value
    state["pttl"] = send(raw, "PTTL", key)
    return state


def check_key(run: Run, key: str, expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    problems = []
    if expected["type"] != actual["type"]:
        return [f"{key}: a {actual['type']}, expected a {expected['type']}"]
    value = actual["value"]
    if expected["type"] == "hash":
        if set(expected["value"]) != set(value):
            problems.append(f"{key}: fields {sorted(value)}, expected {sorted(expected['value'])}")
        else:
            problems += [
                f"{key}: field {f} = {value[f]!r}, expected {e!r}"
                for f, e in expected["value"].items()
                if not run.matches(e, value[f])
            ]
    elif not run.matches(expected["value"], value):
        problems.append(f"{key}: {value!r}, expected {expected['value']!r}")
    pttl = expected.get("pttl", -1)
    if pttl == -1 and actual["pttl"] != -1:
        problems.append(f"{key}: a TTL of {actual['pttl']} ms, expected none")
    if isinstance(pttl, list) and not pttl[0] <= actual["pttl"] <= pttl[1]:
        problems.append(f"{key}: a TTL of {actual['pttl']} ms, expected {pttl[0]} to {pttl[1]}")
    return problems


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_conformance_case(case: dict[str, Any], raw: redis.Redis, namespace: str) -> None:
    run = Run(raw, namespace)
    shas = {}
    for name, sha in DOCUMENT["scripts"].items():
        shas[name] = send(raw, "SCRIPT", "LOAD", scripts.script(name).source)
        assert shas[name] == sha, f"SCRIPT LOAD of {name} gave {shas[name]}, the file says {sha}"
    replies = []
    for number, step in enumerate(case["steps"], 1):
        now = run.redis_ms()
        if "call" in step:
            keys = [run.fill(k, now) for k in step["keys"]]
            command = ["EVALSHA", shas[step["call"]], str(len(keys)), *keys, *(run.fill(a, now) for a in step["argv"])]
        else:
            command = [run.fill(a, now) for a in step["command"]]
        replies.append((number, step, send(raw, *command)))
    run.last = run.redis_ms()
    problems = [
        f"step {number}: replied {reply!r}, expected {step['reply']!r}"
        for number, step, reply in replies
        if "reply" in step and not run.matches(step["reply"], reply)
    ]
    expected_keys = {run.fill(k, run.first): v for k, v in case["keys"].items()}
    found, cursor = set(), "0"
    while True:
        cursor, names = send(raw, "SCAN", cursor, "MATCH", f"{namespace}:*", "COUNT", "1000")
        found.update(names)
        if cursor == "0":
            break
    if found != set(expected_keys):
        problems.append(f"keys {sorted(found)}, expected {sorted(expected_keys)}")
    for key in sorted(found & set(expected_keys)):
        problems += check_key(run, key, expected_keys[key], key_state(raw, key))
    assert not problems, "\n".join([case["name"], *problems])
