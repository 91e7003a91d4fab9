"""transport's drivers against real Redis: one operation, run by `run_sync` and `run_async`, gets the same
replies, the same exceptions where it asked, and the same reloads of forgotten scripts."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobcar.client import AsyncClient
from jobcar.keys import QueueKeys
from jobcar.scripts import Arg, Reply, ScriptCall, script
from jobcar.transitions import parse_stats, pause_call, stats_call
from jobcar.transport import Operation, RoundTrips, Sleep, run_async, run_calls, run_sync
from tests.servers import RedisServer, free_port

AnyRedis = redis.Redis | redis.RedisCluster


def counted(key: str) -> Operation[tuple[Reply, list[Reply], str]]:
    """A command, a pipeline with an error among its replies, a pause, and an error caught where it was asked."""
    first = yield ("INCR", key)
    replies = yield [("INCR", key), ("HSET", key, "f", "v"), ("GET", key)]
    yield Sleep(0.001)
    try:
        yield ("HGET", key, "f")
    except redis.ResponseError as exc:  # the key holds a string: WRONGTYPE, raised here in the operation
        return first, replies, str(exc).split()[0]
    raise AssertionError("HGET on a string should fail")


def check_counted(result: tuple[Reply, list[Reply], str]) -> None:
    first, (incr, hset, get), error = result
    assert (first, incr, get) == (1, 2, b"2")
    assert isinstance(hset, redis.ResponseError), "a pipeline's error reply is a reply, not raised"
    assert error == "WRONGTYPE"


def test_run_sync_sends_what_the_operation_asks(any_redis: AnyRedis, namespace: str) -> None:
    check_counted(run_sync(any_redis, counted(f"{namespace}:n")))


async def test_run_async_sends_the_same(redis_server: RedisServer, namespace: str) -> None:
    async with redis.asyncio.Redis.from_url(redis_server.url) as client:
        check_counted(await run_async(client, counted(f"{namespace}:n")))


def test_forgotten_scripts_are_loaded_again_in_a_pipeline_and_alone(any_redis: AnyRedis, namespace: str) -> None:
    keys = QueueKeys.of(namespace, "q")
    any_redis.script_flush()
    paused, stats = run_sync(any_redis, run_calls([pause_call(keys, True), stats_call(keys)]))
    assert (paused, parse_stats(keys, stats).paused) == (1, True)
    any_redis.script_flush()
    assert run_sync(any_redis, run_calls([pause_call(keys, False)])) == [1]


def refused_enqueue(keys: QueueKeys) -> ScriptCall:
    """An enqueue call the script refuses (a field producers may not set), writing nothing."""
    record: list[Arg] = ["bad-1", "t", b"{}", 0, 0, "", 0, 1, "attempt", "99"]
    return ScriptCall(script("enqueue"), (keys.pending, keys.scheduled, keys.wake), (keys.prefix, *record))


async def test_an_error_reply_stands_beside_the_others_when_asked(redis_server: RedisServer, namespace: str) -> None:
    keys = QueueKeys.of(namespace, "q")
    async with redis.asyncio.Redis.from_url(redis_server.url) as client:
        await client.script_flush()
        stats, refused = await run_async(
            client, run_calls([stats_call(keys), refused_enqueue(keys)], raise_on_error=False)
        )
        assert parse_stats(keys, stats).pending == 0
        assert isinstance(refused, redis.ResponseError)
        [alone] = await run_async(client, run_calls([refused_enqueue(keys)], raise_on_error=False))
        assert isinstance(alone, redis.ResponseError)
        with pytest.raises(redis.ResponseError, match='unknown job field "attempt"'):
            await run_async(client, run_calls([stats_call(keys), refused_enqueue(keys)]))


async def test_shared_round_trips_answer_each_request_as_if_alone(redis_server: RedisServer, namespace: str) -> None:
    """Commands and pipelines of many operations at once: fewer round trips than requests, each operation
    with its own replies, its own error raised where it asked, a forgotten script loaded again."""
    async with redis.asyncio.Redis.from_url(redis_server.url) as client:
        trips = RoundTrips(client)
        keys = [f"{namespace}:n{i}" for i in range(50)]
        await client.script_flush()
        paused = [run_async(client, run_calls([pause_call(QueueKeys.of(namespace, f"q{i}"), True)]), trips)
                  for i in range(20)]  # fmt: skip
        results = await asyncio.gather(*(run_async(client, counted(key), trips) for key in keys), *paused)
        for result in results[: len(keys)]:
            check_counted(result)  # type: ignore[arg-type]
        assert results[len(keys) :] == [[1]] * 20
        assert trips.sent <= len(keys)  # 270 requests (four each, and the pauses) in a few round trips


async def test_a_lost_connection_fails_each_request_of_its_round_trip(namespace: str) -> None:
    async with redis.asyncio.Redis(port=free_port(), retry=Retry(NoBackoff(), 0)) as client:
        trips = RoundTrips(client)
        results = await asyncio.gather(*(run_async(client, counted(f"{namespace}:{i}"), trips) for i in range(5)),
                                       return_exceptions=True)  # fmt: skip
        assert all(isinstance(r, redis.ConnectionError) for r in results), results


@pytest.mark.cluster
async def test_shared_round_trips_on_a_cluster(redis_cluster: list[RedisServer], namespace: str) -> None:
    """Requests whose keys live on every master share round trips too (redis-py's cluster pipeline sends each
    node its part)."""
    async with redis.asyncio.RedisCluster(host="127.0.0.1", port=redis_cluster[0].port) as cluster:
        client = AsyncClient(cluster, namespace=namespace, shared_round_trips=True)
        queues = [f"q{n}" for n in range(12)]  # hash tags spread over the masters
        infos = await asyncio.gather(*(client.enqueue("t", {"n": n}, queue=q) for n, q in enumerate(queues)))
        assert [(info.queue, info.created) for info in infos] == [(q, True) for q in queues]
        assert client.round_trips is not None
        assert client.round_trips.sent < len(queues)
