"""The limit group names: lua/includes/group_names.lua (inlined or not) and limit_groups.py make and read
the same names, whatever the key holds."""

from __future__ import annotations

import json

import pytest
import redis

from jobcar.limit_groups import GroupKind, GroupName, concurrency_group, parse_group, rate_group, turn_group
from jobcar.scripts import assemble, expand_includes

#: Keys as producers give them (records.LIMIT_KEY_PATTERN: any printable text) and as the lease makes them.
KEYS = ["k", "", "a#b", "#", "##", "@x", "~y#z", "with space", "'\"", "ключ", "sha1:" + "0" * 40]
TYPES = ["t", "order.ship", "a:b-c_d"]

BODY = """#!lua
--- @include "group_names"
local job_type, key = ARGV[1], ARGV[2]
local names = {key_group(job_type, key), rate_group(job_type), key_rate_group(job_type, key),
  turn_group(job_type, key), job_type}
local parsed = {}
for _, name in ipairs(names) do
  local kind, of_type, of_key = group_parts(name)
  parsed[#parsed + 1] = {kind, of_type, of_key or cjson.null, is_turn_group(name), names_a_key(name),
    type_of_slots(name .. '\\n' .. key_group(job_type, key)) or cjson.null}
end
return cjson.encode({names, parsed})
"""


@pytest.mark.parametrize("inlined", [True, False], ids=["inlined", "as-functions"])
def test_the_scripts_and_the_daemon_make_and_read_the_same_names(r: redis.Redis, inlined: bool) -> None:
    source = assemble(BODY) if inlined else expand_includes(BODY, set())
    for job_type in TYPES:
        for key in KEYS:
            names, parsed = json.loads(r.eval(source, 0, job_type, key))
            assert names == [
                concurrency_group(job_type, key), rate_group(job_type), rate_group(job_type, key),
                turn_group(job_type, key), concurrency_group(job_type),
            ]  # fmt: skip
            for name, (kind, of_type, of_key, is_turn, has_key, slots_type) in zip(names, parsed, strict=True):
                read = parse_group(name)
                assert GroupName(GroupKind(kind), of_type, of_key) == read, name
                assert is_turn == (read.kind is GroupKind.TURN)
                if read.kind is GroupKind.CONCURRENCY:
                    assert has_key == (read.key is not None)
                    assert slots_type == read.job_type


def test_a_name_reads_back_as_it_was_made() -> None:
    for job_type in TYPES:
        for key in KEYS:
            for name in (GroupName(kind, job_type, key) for kind in GroupKind):
                assert parse_group(str(name)) == name
            for kind in (GroupKind.CONCURRENCY, GroupKind.RATE):
                assert parse_group(str(GroupName(kind, job_type))) == GroupName(kind, job_type)
