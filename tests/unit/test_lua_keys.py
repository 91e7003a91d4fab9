"""lua/includes/keys.lua names every key of a queue as keys.py's QueueKeys does, inlined or not, and no
script or other helper builds a key's name by hand."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources

import pytest
import redis

from jobcar.keys import QueueKeys
from jobcar.leasing import SETTLED_WAKE
from jobcar.queue_settings import MAX_PENDING_FIELD, REFUSED_FIELD, type_bound_field
from jobcar.scripts import assemble, expand_includes

LUA = resources.files("jobcar") / "lua"
KEYS_LUA = (LUA / "includes" / "keys.lua").read_text()
#: name -> its parameters after the prefix
BUILDERS = {
    name: params.split(", ")[1:] for name, params in re.findall(r"^local function (\w+)\(([\w, ]*)\)", KEYS_LUA, re.M)
}
#: What each builder names, by keys.py: the key of queue `keys` for argument `x` (unused by a queue's own keys).
MIRROR: dict[str, Callable[[QueueKeys, str], str]] = {
    "job_key_of": lambda k, x: k.job(x),
    "waiter_key_of": lambda k, x: k.waiter(x),
    "unique_key_of": lambda k, x: k.unique(x),
    "window_key_of": lambda k, x: k.window(x),
    "debounce_key_of": lambda k, x: k.debounce(x),
    "schedule_key_of": lambda k, x: k.schedule(x),
    "batch_key_of": lambda k, x: k.batch(x),
    "deps_key_of": lambda k, x: k.deps(x),
    "dependents_key_of": lambda k, x: k.dependents(x),
    "history_key_of": lambda k, x: k.history_hour(int(x)),
    "slots_key_of": lambda k, x: k.slots(x),
    "held_key_of": lambda k, x: k.held(x),
    "tat_key_of": lambda k, x: k.tat(x),
    "turns_key_of": lambda k, x: k.turns(x),
    "pending_key_of": lambda k, _: k.pending,
    "dead_key_of": lambda k, _: k.dead,
    "released_key_of": lambda k, _: k.released,
    "wake_key_of": lambda k, _: k.wake,
    "waiting_key_of": lambda k, _: k.waiting,
    "settled_key_of": lambda k, _: k.settled,
    "limit_groups_key_of": lambda k, _: k.limit_groups,
    "throttled_key_of": lambda k, _: k.throttled,
    "settings_key_of": lambda k, _: k.settings,
    "pending_counts_key_of": lambda k, _: k.pending_counts,
    "log_key_of": lambda k, x: k.log(x),
    "steps_key_of": lambda k, x: k.steps(x),
    "children_key_of": lambda k, x: k.children(x),
}
#: Ids, keys and names as producers give them: any printable text (history takes an hour).
ARGUMENTS = ["42", "a:b", "{other}", "with space", "#@~", "'quote\"", "*?[x]\\", "ключ", "473000"]
SOURCES = sorted(
    [f"{p.name}" for p in LUA.iterdir() if p.name.endswith(".lua")]
    + [f"includes/{p.name}" for p in (LUA / "includes").iterdir() if p.name.endswith(".lua") and p.name != "keys.lua"]
    + [f"repair/{p.name}" for p in (LUA / "repair").iterdir() if p.name.endswith(".lua")]
)
#: The names of the kinds of key keys.lua builds: 'job:', 'dead', 'pending:released'...
KINDS = sorted(set(re.findall(r"prefix \.\. '([a-z_:]+)'", KEYS_LUA)))


def test_every_key_builder_has_its_mirror_in_keys_py() -> None:
    assert set(BUILDERS) == set(MIRROR)


@pytest.mark.parametrize("inlined", [True, False], ids=["inlined", "as-functions"])
def test_each_builder_names_the_key_keys_py_names(r: redis.Redis, namespace: str, inlined: bool) -> None:
    names = sorted(BUILDERS)
    calls = ", ".join(f"{name}(ARGV[1]{', ARGV[2]' if BUILDERS[name] else ''})" for name in names)
    body = f'#!lua\n--- @include "keys"\nreturn {{{calls}}}\n'
    source = assemble(body) if inlined else expand_includes(body, set())
    assert ("local function" in source) is not inlined
    keys = QueueKeys.of(namespace, "q-1")
    for x in ARGUMENTS:
        got = [b.decode() for b in r.eval(source, 0, keys.prefix, x)]
        want = [
            MIRROR[name](keys, x) if name != "history_key_of" or x.isdigit() else got[i] for i, name in enumerate(names)
        ]
        assert got == want, x


@pytest.mark.parametrize("source", SOURCES)
def test_no_script_builds_a_key_name_by_hand(source: str) -> None:
    code = re.sub(r"--.*", "", (LUA / source).read_text())
    by_hand = re.findall(r"(?:prefix|ARGV\[1\]|KEYS\[\d+\]) \.\. '", code)
    kinds = [kind for kind in KINDS if re.search(r"\.\. '" + re.escape(kind), code)]
    assert not by_hand, f"{source}: build the key with includes/keys.lua"
    assert not kinds, f"{source}: build the key with includes/keys.lua"


def test_the_pending_lists_are_those_keys_py_names(r: redis.Redis, namespace: str) -> None:
    keys = QueueKeys.of(namespace, "q-1")
    body = '#!lua\n--- @include "pending_lists"\nreturn pending_lists(KEYS[1])\n'
    assert [b.decode() for b in r.eval(assemble(body), 1, keys.pending)] == list(keys.pending_lists)


def test_the_settled_wake_is_the_element_the_watchers_look_for(r: redis.Redis) -> None:
    body = '#!lua\n--- @include "wake"\nreturn SETTLED_WAKE\n'
    assert r.eval(assemble(body), 0) == SETTLED_WAKE


def test_the_settings_fields_are_those_queue_settings_names(r: redis.Redis) -> None:
    body = '#!lua\n--- @include "settings_fields"\nreturn {MAX_PENDING_FIELD, REFUSED_FIELD, TYPE_BOUND_PREFIX}\n'
    assert r.eval(assemble(body), 0) == [
        MAX_PENDING_FIELD.encode(),
        REFUSED_FIELD.encode(),
        type_bound_field("").encode(),
    ]
