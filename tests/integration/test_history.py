"""The fleet-wide history of finished attempts: daemons count in memory, flush to Redis, and `jobcar stats`
shows processed and failed counts for the last minute and hour, summed over every daemon."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ResponseError

from jobcar import State
from jobcar.admin import Admin
from jobcar.config_types import Config
from jobcar.fleet import Announcer
from jobcar.history import History
from jobcar.history_calls import HISTORY_SLOT_MS, count_call
from jobcar.keys import QueueKeys, daemons_key
from jobcar.recording import Recorded
from jobcar.redis_link import RedisLink, RedisRefused, RedisUnavailable, connect
from jobcar.scripts import call
from jobcar.transport import execute_async
from tests.integration.conftest import StartDaemon
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.servers import RedisServer, free_port, wait_for

HOUR_MS = 3_600_000


@pytest.fixture
async def link(redis_server: RedisServer) -> AsyncIterator[RedisLink]:
    link = RedisLink(connect(redis_server.url, cluster=False), connect(redis_server.url, cluster=False))
    yield link
    await link.aclose()


@pytest.mark.asyncio
async def test_counts_are_added_per_queue_type_and_outcome(link: RedisLink, namespace: str) -> None:
    history = History(namespace, link, ["default"])
    for recorded in (Recorded.DONE, Recorded.DONE, Recorded.RETRIED, Recorded.DEAD, Recorded.RETURNED):
        history.add("default", "email", recorded)
    history.add("low", "report", Recorded.DONE)
    history.add("low", "report", Recorded.LEASE_LOST)
    await history.flush()
    await history.flush()  # nothing new: adds nothing
    default, low = await Admin(link.client, namespace).history(["default", "low"])
    assert default.totals(HOUR_MS) == {"done": 2, "failed": 2, "dead": 1}
    assert default.totals(HOUR_MS, job_type="other") == {"done": 0, "failed": 0, "dead": 0}
    assert low.totals(HOUR_MS) == {"done": 1, "failed": 0, "dead": 0}
    assert all(slot % HISTORY_SLOT_MS == 0 for slot, _, _ in default.counts)


@pytest.mark.asyncio
async def test_counts_a_flush_could_not_write_are_kept_for_the_next(link: RedisLink, namespace: str) -> None:
    away_client = connect(f"redis://127.0.0.1:{free_port()}/0", cluster=False)
    away = RedisLink(away_client, away_client)
    history = History(namespace, away, ["default"])
    history.add("default", "email", Recorded.DONE)
    with pytest.raises(RedisUnavailable):
        await history.flush()
    history.add("default", "email", Recorded.DONE)
    history.link = link
    await history.flush()
    (default,) = await Admin(link.client, namespace).history(["default"])
    assert default.totals(HOUR_MS)["done"] == 2
    await away.aclose()


def test_stats_shows_the_fleets_processed_and_failed_counts(start_daemon: StartDaemon, q: QueueDriver) -> None:
    handlers = {"ok": {"command": ["true"]}, "bad": {"command": ["false"], "max_attempts": 1}}
    daemons = [start_daemon(handlers), start_daemon(handlers)]
    ids = [q.enqueue("ok").id for _ in range(6)] + [q.enqueue("bad").id for _ in range(2)]
    wait_for(lambda: all(q.where(i) in (None, State.DEAD) for i in ids), what="every job to end")
    config = daemons[0].config_path

    def counted() -> dict[str, object]:
        done = cli("stats", "-c", str(config), "--queue", "default", "--json")
        assert done.returncode == 0, done.stderr
        (default,) = json.loads(done.stdout)
        assert isinstance(default, dict)
        return default

    # Each daemon flushes its counts within five seconds.
    wait_for(lambda: counted()["processed_last_hour"] == 8, timeout=20, what="both daemons' counts")
    default = counted()
    assert default["failed_last_hour"] == 2
    assert default["processed_last_minute"] == 8
    assert default["failed_last_minute"] == 2


def test_a_daemon_with_history_off_counts_nothing(start_daemon: StartDaemon, q: QueueDriver) -> None:
    handlers = {"ok": {"command": ["true"]}}
    daemon = start_daemon(handlers, history=False)
    ids = [q.enqueue("ok").id for _ in range(3)]
    wait_for(lambda: all(q.where(i) is None for i in ids), what="every job to end")
    daemon.stop()  # a drain flushes what was counted: here, nothing
    assert not q.redis.keys(q.keys.prefix + "history*")


@pytest.mark.asyncio
async def test_a_history_hour_or_daemons_key_of_another_type_is_refused_naming_it(
    link: RedisLink, namespace: str, redis_server: RedisServer
) -> None:
    """The counts' flush, the history's read and the fleet's announce name a key written by something else,
    as every other refusal does, instead of a bare WRONGTYPE."""
    keys = QueueKeys.of(namespace, "default")
    hour = int((await link.client.time())[0]) * 1000 // HOUR_MS
    with redis_server.client() as client:
        client.set(keys.history_hour(hour), "written by something else")
        client.set(daemons_key(namespace), "written by something else")
    expected = f"{keys.history_hour(hour)} holds a string, not a hash"
    with pytest.raises(ResponseError, match=re.escape(expected)):
        await execute_async(link.client, [count_call(keys, {("email", "done"): 1})])
    with pytest.raises(ResponseError, match=re.escape(expected)):
        await Admin(link.client, namespace).history(["default"])
    announce = call("announce", (daemons_key(namespace),), ("d1", 60_000))  # a sweep's read
    with pytest.raises(ResponseError, match=re.escape(f"{daemons_key(namespace)} holds a string, not a hash")):
        await execute_async(link.client, [announce])
    # The entry's write (an HSET of the daemon's own), after a sweep that found the key a hash.
    announcer = Announcer(link, Config(source="t.yaml", namespace=namespace), lambda: 0)
    with redis_server.client() as client:
        client.delete(daemons_key(namespace))
        await announcer.announce()
        client.set(daemons_key(namespace), "written by something else")
    with pytest.raises(RedisRefused, match=re.escape(f"{daemons_key(namespace)} holds another type, not a hash")):
        await announcer.announce()
