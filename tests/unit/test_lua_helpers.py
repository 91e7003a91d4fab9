"""scripts.script: each script carries the helpers it names with `--- @include`, each once, and no others."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from jobcar.scripts import ONE_LINER, assemble, expand_includes, script

LUA = resources.files("jobcar") / "lua"
SCRIPTS = sorted(
    [p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua")]
    + [f"repair/{p.name.removesuffix('.lua')}" for p in (LUA / "repair").iterdir() if p.name.endswith(".lua")]
)
HELPERS = sorted(p.name.removesuffix(".lua") for p in (LUA / "includes").iterdir() if p.name.endswith(".lua"))
#: What a script may call without defining it: Lua's own functions (Redis's Lua 5.1 sandbox).
LUA_BUILTINS = {"tonumber", "tostring", "unpack", "pcall", "ipairs", "pairs", "type", "error", "select", "next"}
CALLED = re.compile(r"(?<![.:\w])([A-Za-z_]\w*)\s*\(")
LOCAL_FUNCTION = re.compile(r"\blocal function ([A-Za-z_]\w*)")
KEYWORDS = {"if", "and", "or", "not", "return", "in", "function", "elseif", "while", "until"}


def code(lua: str) -> str:
    """The Lua without comments and string literals (whose words are not calls)."""
    return re.sub(r"'[^']*'|\"[^\"]*\"", "''", re.sub(r"--.*", "", lua))


def source_of(name: str) -> str:
    """The script's file as written, its includes not expanded."""
    return (LUA / f"{name}.lua").read_text()


def defined(name: str) -> list[str]:
    return LOCAL_FUNCTION.findall(script(name).source)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_function_a_script_calls_is_defined_in_it(name: str) -> None:
    source = code(script(name).source)
    called = set(CALLED.findall(source)) - KEYWORDS - LUA_BUILTINS
    assert called <= set(LOCAL_FUNCTION.findall(source)), name


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_include_line_is_left_and_no_helper_is_defined_twice(name: str) -> None:
    source = script(name).source
    assert "@include" not in source
    names = defined(name)
    assert len(names) == len(set(names)), name
    assert source.startswith("#!lua")


def test_a_script_carries_only_the_helpers_it_needs_including_helpers_of_helpers() -> None:
    enqueue = set(defined("enqueue"))
    assert {"now_ms", "wake", "call_in_chunks", "bump_batch"} <= enqueue
    # Counting a batch's total never fires it: enqueue carries none of the helpers that tell its callbacks.
    assert not {"add_to_batch", "tell_dependents", "trim_dead", "record_error", "move_to_dead", "holds_lease"} & enqueue
    requeue = set(defined("requeue"))
    # add_to_batch via count_in_batch, bump_batch via add_to_batch
    assert {"count_in_batch", "add_to_batch", "bump_batch", "move_to_pending"} <= requeue
    kill = set(defined("kill"))
    # kill includes move_to_dead, which needs record_error, release_unique (then release_lock) and trim_dead.
    assert {"move_to_dead", "record_error", "release_unique", "release_lock", "trim_dead"} <= kill


def test_a_helper_comes_before_the_helpers_and_the_body_that_use_it() -> None:
    source = expand_includes('#!lua\n--- @include "move_to_dead"\n--- @include "record_error"\nreturn 1', set())
    assert source.index("local function record_error") < source.index("local function move_to_dead")
    assert source.count("local function record_error") == 1
    assert source.splitlines()[0] == "#!lua"
    assert source.rstrip().splitlines()[-1] == "return 1"


def test_a_body_that_names_no_helper_gets_none() -> None:
    assert expand_includes("#!lua\nreturn 1", set()) == "#!lua\nreturn 1"


def test_every_helper_is_included_by_some_script() -> None:
    used = {helper for name in SCRIPTS for helper in defined(name)}
    helpers = "".join((LUA / "includes" / f"{helper}.lua").read_text() for helper in HELPERS)
    one_liners = {name for name, _, _ in ONE_LINER.findall(helpers)}
    assert set(LOCAL_FUNCTION.findall(helpers)) - one_liners <= used
    # A one-line helper is inlined where it is called: some script calls it before that.
    called = {f for name in SCRIPTS for f in CALLED.findall(code(expand_includes(source_of(name), set())))}
    assert one_liners <= called


def test_a_one_line_helper_is_inlined_where_it_is_called() -> None:
    body = """#!lua
local function job_key_of(prefix, id) return prefix .. 'job:' .. id end
local function pair(a, b) return a .. '#' .. b end
-- job_key_of(a comment is left as it is
local key = job_key_of(ARGV[1], ARGV[at + 1])
redis.call('DEL', job_key_of(prefix, pair(a or 'x,)', f(b, c))), 'job_key_of(')
"""
    assert (
        assemble(body)
        == """#!lua
-- job_key_of(a comment is left as it is
local key = (ARGV[1] .. 'job:' .. ARGV[at + 1])
redis.call('DEL', (prefix .. 'job:' .. (((a or 'x,)') .. '#' .. (f(b, c))))), 'job_key_of(')
"""
    )
