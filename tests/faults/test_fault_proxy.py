"""The fault proxy itself, the redis-py cancellation bug class through it (CVE-2023-28858/9), and a real
daemon whose Redis goes silent for a while (guarantee #7 of docs/delivery-semantics.md, shortened)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobcar import transitions, transport
from jobcar.keys import QueueKeys
from tests.faultproxy import FaultProxy
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_server.port) as p:
        yield p


def through(proxy: FaultProxy, **options: object) -> redis.Redis:
    """A sync client through the proxy with no silent retries: every fault is seen by the test."""
    return redis.Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0), **options)  # type: ignore[arg-type]


# --- the proxy's own behaviour ------------------------------------------------------------------


def test_data_passes_unchanged_through_slices_and_latency(proxy: FaultProxy, namespace: str) -> None:
    value = os.urandom(50_000)
    proxy.slice_size = 7
    proxy.latency, proxy.jitter = 0.02, 0.01
    with through(proxy, socket_timeout=10) as c:
        assert c.set(f"{namespace}:v", value)
        assert c.get(f"{namespace}:v") == value
        started = time.monotonic()
        assert c.ping()
        assert time.monotonic() - started >= 0.04, "latency applies in each direction"
    assert proxy.bytes_up > len(value)
    assert proxy.bytes_down > len(value)
    assert proxy.connections == 1


def test_blackhole_makes_a_command_time_out(proxy: FaultProxy) -> None:
    with through(proxy, socket_timeout=0.5) as c:
        assert c.ping()
        proxy.blackhole = True
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            c.ping()
        assert time.monotonic() - started >= 0.45
        # A timeout, not a ConnectionError: the proxy sent no RST and no FIN, the connection just hung.
        # (redis-py then closes it itself, so `proxy.open` may already be 0 here.)
        assert proxy.resets == 0
        proxy.blackhole = False
        assert c.ping(), "a new connection works once the blackhole is lifted"


def test_reset_fails_the_command_in_flight_and_a_new_connection_works(proxy: FaultProxy) -> None:
    with through(proxy, socket_timeout=5) as c:
        assert c.ping()
        wait_for(lambda: proxy.open == 1, what="the proxied connection")
        proxy.latency = 0.5  # hold the reply in the proxy, so the RST lands while PING waits for it
        outcome: list[BaseException | object] = []

        def ping() -> None:
            try:
                outcome.append(c.ping())
            except BaseException as exc:
                outcome.append(exc)

        sent = proxy.bytes_up
        worker = threading.Thread(target=ping)
        worker.start()
        wait_for(lambda: proxy.bytes_up > sent, what="PING on the wire")
        assert proxy.reset() == 1
        worker.join(timeout=5)
        assert len(outcome) == 1, outcome
        assert isinstance(outcome[0], redis.ConnectionError), outcome
        proxy.latency = 0
        assert c.ping()
    assert proxy.connections == 2
    assert proxy.resets == 1


def test_an_idle_connection_reset_is_replaced_by_the_pool(proxy: FaultProxy) -> None:
    """redis-py's pool notices an RST on an idle connection when it hands it out and reconnects."""
    with through(proxy, socket_timeout=5) as c:
        assert c.ping()
        wait_for(lambda: proxy.open == 1, what="the proxied connection")
        assert proxy.reset() == 1
        assert c.ping()
    assert proxy.connections == 2


@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_on_uvloop_a_reset_idle_connection_fails_the_next_call_as_a_connection_error(
    proxy: FaultProxy, namespace: str
) -> None:
    """The asyncio pool does not notice; on uvloop redis-py's write then raises RuntimeError ("the
    handler is closed"), which the daemon's calls must see as the connection error it is, or its loops
    take an outage for a bug and a finishing job's ack is never retried."""
    keys = QueueKeys.of(namespace, "default")

    async def transport_closed(client: redis.asyncio.Redis) -> None:
        """Until uvloop has read the RST and closed the idle pooled connection's transport: the state in
        which redis-py's next write raises instead of failing on the read."""
        (connection,) = client.connection_pool._available_connections  # the one idle connection
        deadline = time.monotonic() + 10
        while not connection._writer.transport.is_closing():  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the reset never reached the client's transport"
            await asyncio.sleep(0.005)

    client = redis.asyncio.Redis(host="127.0.0.1", port=proxy.port, retry=Retry(NoBackoff(), 0))
    outcomes = []
    try:
        for _ in range(5):
            await transport.execute_async(client, [transitions.stats_call(keys)])
            proxy.reset()
            await transport_closed(client)
            try:
                await transport.execute_async(client, [transitions.stats_call(keys)])
                outcomes.append("answered")
            except redis.ConnectionError:
                outcomes.append("connection error")
    finally:
        await client.aclose()
    assert set(outcomes) <= {"answered", "connection error"}, outcomes
    assert "connection error" in outcomes, "the RuntimeError case did not occur: the test proves nothing"
    assert outcomes == ["connection error"] * 5, "each write into a closed transport is a connection error"


def test_refuse_closes_new_connections_at_once(proxy: FaultProxy) -> None:
    proxy.refuse = True
    with through(proxy, socket_timeout=5) as c:
        with pytest.raises(redis.ConnectionError):
            c.ping()
        proxy.refuse = False
        assert c.ping()


def test_data_limit_resets_the_connection(proxy: FaultProxy, namespace: str) -> None:
    proxy.data_limit = 1000
    with through(proxy, socket_timeout=5) as c:
        assert c.ping()
        with pytest.raises(redis.ConnectionError):
            c.set(f"{namespace}:big", b"x" * 5000)
        proxy.data_limit = None
        assert c.ping()
    assert proxy.resets == 1
    assert proxy.bytes_up >= 1000


# --- the redis-py asyncio cancellation bug class (CVE-2023-28858/9) -----------------------------

LATENCY = 0.3
CANCEL_AFTER = 0.05
ROUNDS = 20


def async_client(proxy: FaultProxy) -> redis.asyncio.Redis:
    # RESP2 and no CLIENT SETINFO: a new connection sends nothing before the first command, so the
    # cancellation below always lands while the command's own reply is in flight.
    return redis.asyncio.Redis(
        host="127.0.0.1", port=proxy.port, protocol=2, driver_info=None, retry=Retry(NoBackoff(), 0), socket_timeout=10
    )


@pytest.mark.parametrize("mode", ["command", "pipeline"])
async def test_a_cancelled_command_never_hands_its_reply_to_the_next(
    proxy: FaultProxy, r: redis.Redis, namespace: str, mode: str
) -> None:
    a, b = f"{namespace}:a", f"{namespace}:b"
    r.set(a, 1)
    r.set(b, 2)

    async def get_a(client: redis.asyncio.Redis) -> object:
        if mode == "command":
            return await client.get(a)
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(a)
            return await pipe.execute()

    async def get_b(client: redis.asyncio.Redis) -> object:
        if mode == "command":
            return await client.get(b)
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(b)
            return (await pipe.execute())[0]

    client = async_client(proxy)
    try:
        proxy.latency = LATENCY
        for i in range(ROUNDS):
            sent_before = proxy.bytes_up
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(get_a(client), CANCEL_AFTER)
            assert proxy.bytes_up > sent_before, f"round {i}: GET a reached the wire before the cancel"
            assert await get_b(client) == b"2", f"round {i}: the cancelled GET a's reply leaked"
    finally:
        await client.aclose()
    # redis-py >= 4.5.4 drops the connection of a cancelled command: one new connection per round.
    assert proxy.connections >= ROUNDS


# --- a real daemon whose Redis goes silent ------------------------------------------------------


def test_daemon_survives_a_blackholed_redis_and_completes_every_job_once(
    redis_server: RedisServer, proxy: FaultProxy, namespace: str, tmp_path: Path
) -> None:
    def ok(_: Received) -> tuple[int, dict[str, str], bytes]:
        return 200, {}, b"ok"

    with handler_server() as handlers, redis_server.client() as client:
        url = handlers.url("/jobs/ok", ok)
        config = write_config(tmp_path, proxy.url_for_redis(), namespace, {"work": {"url": url}}, lease="3s")
        daemon = DaemonProcess(config).start()
        try:
            q = QueueDriver(client, namespace)
            ids = [i.id for i in q.producer.enqueue_many([("work", n) for n in range(50)])]
            proxy.blackhole = True
            ids += [i.id for i in q.producer.enqueue_many([("work", n) for n in range(50, 55)])]
            time.sleep(3)  # the fault itself: Redis is silent for 3 s
            proxy.blackhole = False

            def all_done() -> bool:
                return all(q.job(i) is None for i in ids)

            restored = time.monotonic()
            wait_for(all_done, timeout=60, what="all 55 jobs to complete")
            elapsed = time.monotonic() - restored
            daemon.wait_for_log("redis reachable again", timeout=10)
            assert daemon.process is not None
            assert daemon.process.poll() is None, "the daemon never exits"
            per_job = Counter(req.headers["jobcar-job-id"] for req in handlers.requests_to("/jobs/ok"))
            assert set(per_job) == set(ids), "every job ran"
            assert max(per_job.values()) <= 2, f"a job ran more than twice: {per_job.most_common(3)}"
            twice = sum(1 for n in per_job.values() if n == 2)
            print(f"[blackhole] all done {elapsed:.1f} s after the blackhole was lifted; {twice} jobs ran twice")
            assert client.zcard(q.keys.active) == 0
            assert client.llen(q.keys.pending) == 0
            assert client.zcard(q.keys.dead) == 0
            lines = [f"{line.get('ts')} {line.get('msg')}" for line in daemon.lines() if line.get("level") != "debug"]
            log = "\n".join(lines)
            health = [m.split(" ", 1)[1] for m in lines if " redis unreachable" in m or " redis reachable again" in m]
            assert health, log
            assert health[0].startswith("redis unreachable"), log
            assert health[-1] == "redis reachable again", log
            # Each connection whose command vanished in the blackhole times out on its own, some after Redis
            # is back (the blocking lease wait after 15 s): those late failures are not a new outage.
            assert len(health) == 2, f"one outage, one report:\n{log}"
        finally:
            daemon.stop()
