"""store.with_helpers: each script carries the _lib.lua helpers it calls, and no others."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from jobcar import store

SCRIPTS = sorted(
    p.name.removesuffix(".lua")
    for p in (resources.files("jobcar") / "lua").iterdir()
    if p.name.endswith(".lua") and not p.name.startswith("_")
)
#: What a script may call without defining it: Lua's own functions (Redis's Lua 5.1 sandbox).
LUA_BUILTINS = {"tonumber", "tostring", "unpack", "pcall", "ipairs", "pairs", "type", "error", "select", "next"}
CALLED = re.compile(r"(?<![.:\w])([A-Za-z_]\w*)\s*\(")
LOCAL_FUNCTION = re.compile(r"\blocal function ([A-Za-z_]\w*)")
KEYWORDS = {"if", "and", "or", "not", "return", "in", "function", "elseif", "while", "until"}


def code(lua: str) -> str:
    """The Lua without comments and string literals (whose words are not calls)."""
    return re.sub(r"'[^']*'|\"[^\"]*\"", "''", re.sub(r"--.*", "", lua))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_function_a_script_calls_is_defined_in_it(name: str) -> None:
    source = code(store.script(name).source)
    called = set(CALLED.findall(source)) - KEYWORDS - LUA_BUILTINS
    assert called <= set(LOCAL_FUNCTION.findall(source)), name


def test_a_script_carries_only_the_helpers_it_needs_including_helpers_of_helpers() -> None:
    enqueue = set(LOCAL_FUNCTION.findall(store.script("enqueue").source))
    assert {"now_ms", "wake", "call_in_chunks", "add_to_batch"} <= enqueue
    assert not {"trim_dead", "record_error", "move_to_dead", "holds_lease", "count_in_batch"} & enqueue
    requeue = set(LOCAL_FUNCTION.findall(store.script("requeue").source))
    assert {"count_in_batch", "add_to_batch", "move_to_pending"} <= requeue  # add_to_batch via count_in_batch
    kill = set(LOCAL_FUNCTION.findall(store.script("kill").source))
    # kill calls move_to_dead, which needs record_error, release_unique (then release_lock) and trim_dead.
    assert {"move_to_dead", "record_error", "release_unique", "release_lock", "trim_dead"} <= kill


def test_helpers_keep_their_order_and_the_script_body_comes_last() -> None:
    source = store.with_helpers("#!lua", "return now_ms() + #{wake}")
    lines = source.splitlines()
    assert lines[0] == "#!lua" and lines[-1] == "return now_ms() + #{wake}"
    assert source.index("local function now_ms") < source.index("local function wake")


def test_a_body_that_names_no_helper_gets_none() -> None:
    assert store.with_helpers("#!lua", "return 1") == "#!lua\nreturn 1"
