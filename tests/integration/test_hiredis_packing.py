"""The daemon's asyncio connections pack commands with hiredis: byte for byte what redis-py would send,
falling back to redis-py for what only it packs, and working against a real server."""

from __future__ import annotations

import pytest
import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from jobcar.hiredis_packing import (
    HiredisConnection,
    HiredisSSLConnection,
    HiredisUnixDomainSocketConnection,
    use_hiredis_packing,
)
from jobcar.redis_link import connect
from tests.servers import RedisServer

ARGUMENT = st.one_of(st.text(), st.binary(), st.integers(min_value=-(2**70), max_value=2**70))
COMMAND_NAME = st.sampled_from(["EVALSHA", "HSET", "SCRIPT LOAD", "CONFIG GET", "set", b"GET", b"CLIENT SETNAME"])


def packed(connection: Connection, *args: object) -> bytes:
    return b"".join(connection.pack_command(*args))  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(COMMAND_NAME, st.lists(ARGUMENT, max_size=12))
def test_packs_exactly_what_redis_py_packs(name: str | bytes, args: list[object]) -> None:
    assert packed(HiredisConnection(), name, *args) == packed(Connection(), name, *args)


@pytest.mark.parametrize("odd", [0.1, 1e20, -2.5, bytearray(b"ab"), memoryview(b"cd")])
def test_arguments_only_redis_py_packs_take_its_path(odd: object) -> None:
    assert packed(HiredisConnection(), "SET", "k", odd) == packed(Connection(), "SET", "k", odd)


@pytest.mark.parametrize("bad", [True, None, object()])
def test_arguments_redis_py_refuses_are_refused_the_same_way(bad: object) -> None:
    with pytest.raises(DataError):
        HiredisConnection().pack_command("SET", "k", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", HiredisConnection),
        ("rediss://127.0.0.1:6379/0", HiredisSSLConnection),
        ("unix:///tmp/redis.sock?db=0", HiredisUnixDomainSocketConnection),
    ],
)
def test_every_kind_of_url_gets_the_hiredis_class_of_its_own_kind(url: str, expected: type) -> None:
    client = redis.asyncio.Redis.from_url(url)
    original = client.connection_pool.connection_class
    use_hiredis_packing(client)
    chosen = client.connection_pool.connection_class
    assert chosen is expected
    assert issubclass(chosen, original)
    assert original in (Connection, SSLConnection, UnixDomainSocketConnection)


async def test_the_daemon_connects_with_hiredis_packing(redis_server: RedisServer) -> None:
    client = connect(redis_server.url, cluster=False)
    assert isinstance(client, redis.asyncio.Redis)
    assert client.connection_pool.connection_class is HiredisConnection
    try:
        sha = await client.script_load("return {ARGV[1], ARGV[2], #ARGV}")  # "SCRIPT LOAD": redis-py's path
        payload = bytes(range(256)) * 4
        reply = await client.execute_command("EVALSHA", sha, 0, payload, 2**62)
        await client.hset("jobcar-test:h", mapping={"é": "ünïcode", "n": -7})
        stored = await client.hgetall("jobcar-test:h")
        await client.delete("jobcar-test:h")
    finally:
        await client.aclose()
    assert reply == [bytes(range(256)) * 4, str(2**62).encode(), 2]
    assert stored == {"é".encode(): "ünïcode".encode(), b"n": b"-7"}
