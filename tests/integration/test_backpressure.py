"""Backpressure (ADR 0024): a queue's `max_pending`, written to Redis by its daemons, refuses in the enqueue script
an enqueue that would take its pending jobs past it: QueueFull in the clients, 429 with Retry-After from the API,
exit 75 from `jobcar enqueue`; shown by `jobcar stats` and the metrics. Against the real server, no mocks."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from jobcar import AsyncClient, Client
from jobcar.config import parse_config
from jobcar.errors import QueueFull
from jobcar.history_calls import QueueHistory
from jobcar.job import EnqueueStatus, State
from jobcar.keys import QueueKeys
from jobcar.queue_settings import configured_bounds, settings_commands, type_bound_field
from jobcar.stats_document import stats_document
from jobcar.transitions import parse_stats, pause_call, stats_call
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import listen_url, post, scrape, value
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.servers import RedisServer, wait_for

JSON = {"Content-Type": "application/json"}


def bound(r: redis.Redis | redis.RedisCluster, namespace: str, queue: str, max_pending: int) -> QueueKeys:
    """What a daemon serving `queue` with `max_pending: {queue: n}` writes (queue_settings.py)."""
    keys = QueueKeys.of(namespace, queue)
    r.hset(keys.settings, "max_pending", max_pending)
    return keys


def stats(q: QueueDriver) -> tuple[int, int | None, int]:
    s = parse_stats(q.keys, q.run(stats_call(q.keys)))
    return s.pending, s.max_pending, s.refused


def test_an_enqueue_past_max_pending_is_refused_whole_and_writes_nothing(
    any_redis: redis.Redis | redis.RedisCluster, namespace: str
) -> None:
    q = QueueDriver(any_redis, namespace)
    client = Client(any_redis, namespace=namespace)
    bound(any_redis, namespace, "default", 3)
    client.enqueue("t", {}, job_id="a")
    client.enqueue("t", {}, job_id="b", priority=5)  # every priority's list counts
    with pytest.raises(QueueFull) as full:
        client.enqueue_many([("t", {}, {"job_id": "c"}), ("t", {}, {"job_id": "d"})])
    assert (full.value.queue, full.value.pending, full.value.max_pending, full.value.refused) == ("default", 2, 3, 2)
    assert (full.value.stored, full.value.retry_after) == ([], 1)
    assert "queue default is full" in str(full.value)
    assert [q.job("c"), q.job("d")] == [None, None], "a refused call writes no job"
    assert stats(q) == (2, 3, 2)

    assert client.enqueue("t", {}, job_id="c").status is EnqueueStatus.CREATED  # up to the bound exactly
    with pytest.raises(QueueFull):
        client.enqueue("t", {}, job_id="e", delay=3600)  # a job of any state counts as one more
    # An id already stored writes nothing, so it is not counted: the producer's retry still gets its answer.
    again = client.enqueue("t", {}, job_id="a")
    assert (again.status, again.state) == (EnqueueStatus.EXISTS, State.PENDING)
    assert stats(q) == (3, 3, 3)

    # Room again once a job leaves the pending lists; scheduled jobs are not counted.
    q.lease_one()
    assert client.enqueue("t", {}, job_id="e", delay=3600).state is State.SCHEDULED
    assert client.enqueue("t", {}, job_id="f").created
    with pytest.raises(QueueFull):
        client.enqueue("t", {}, job_id="g")
    any_redis.hdel(q.keys.settings, "max_pending")  # the bound lifted (a daemon's reload without it)
    assert client.enqueue("t", {}, job_id="g").created
    assert stats(q) == (4, None, 4)


def test_a_call_over_several_queues_stores_the_parts_that_fit(r: redis.Redis, namespace: str) -> None:
    client = Client(r, namespace=namespace)
    bound(r, namespace, "full", 1)
    client.enqueue("t", {}, queue="full", job_id="x")
    jobs = [("t", {"n": n}, {"queue": "free" if n % 2 else "full", "job_id": f"j{n}"}) for n in range(4)]
    with pytest.raises(QueueFull) as full:
        client.enqueue_many(jobs)
    assert (full.value.queue, full.value.refused) == ("full", 2)
    assert [(i.id, i.queue, i.status) for i in full.value.stored] == [
        ("j1", "free", EnqueueStatus.CREATED),
        ("j3", "free", EnqueueStatus.CREATED),
    ]
    assert client.get("j0", queue="full") is None
    assert client.get("j1", queue="free") is not None


def test_a_dependency_refused_tells_the_job_stored_to_wait_for_it(r: redis.Redis, namespace: str) -> None:
    client = Client(r, namespace=namespace)
    bound(r, namespace, "full", 1)
    client.enqueue("t", {}, queue="full", job_id="x")
    # The waiting job is stored first (its own queue has no bound); its dependency is then refused.
    with pytest.raises(QueueFull):
        client.enqueue_many([("t", {}, {"queue": "full", "job_id": "dep"}),
                             ("t", {}, {"queue": "free", "job_id": "w", "after": [("full", "dep")]})])  # fmt: skip
    waiter = client.get("w", queue="free")
    assert waiter is not None
    assert waiter.state is State.DEAD, "told at once that its dependency is gone"


def test_the_async_client_raises_it_too(redis_server: RedisServer, namespace: str) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_server.url, namespace=namespace) as client:
            await client.enqueue("t", {})
            with pytest.raises(QueueFull) as full:
                await client.enqueue("t", {})
            assert (full.value.pending, full.value.max_pending) == (1, 1)

    with redis_server.client() as r:
        bound(r, namespace, "default", 1)
    asyncio.run(main())


def test_the_daemon_writes_its_bound_the_api_refuses_and_stats_show_it(
    start_daemon: StartDaemon, r: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    q = QueueDriver(r, namespace, "bp")
    q.run(pause_call(q.keys, True))  # the jobs stay pending
    daemon = start_daemon({}, queues={"bp": 1}, max_pending={"bp": 2})
    wait_for(lambda: r.hget(q.keys.settings, "max_pending") == b"2", what="the daemon to write its bound")
    base = listen_url(daemon)

    job = json.dumps({"type": "t", "payload": {}, "queue": "bp"}).encode()
    assert post(f"{base}/v1/jobs", job, JSON)[0] == 201
    batch = json.dumps({"jobs": [{"type": "t", "queue": "bp"}] * 2}).encode()
    status, body = post(f"{base}/v1/jobs", batch, JSON)
    assert status == 429
    assert (body["queue"], body["pending"], body["max_pending"], body["refused"]) == ("bp", 1, 2, 2)
    assert "jobs" not in body
    assert "is full" in body["error"]
    assert stats(q) == (1, 2, 2), "the batch was refused whole"
    assert post(f"{base}/v1/jobs", job, JSON)[0] == 201
    status, body = post(f"{base}/v1/jobs", job, JSON)
    assert (status, body["refused"]) == (429, 1)

    request = urllib.request.Request(f"{base}/v1/jobs", data=job, method="POST", headers=JSON)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert (refused.value.code, refused.value.headers["Retry-After"]) == (429, "1")
    refused.value.close()  # its socket, else a ResourceWarning fails whichever test runs next

    samples = scrape(base)
    assert value(samples, "jobcar_queue_max_pending", queue="bp") == 2
    assert value(samples, "jobcar_queue_refused_jobs", queue="bp") == 4

    # The CLI: a non-zero exit (75, EX_TEMPFAIL) and the reason; `jobcar stats` shows the bound and the refusals.
    config = daemon.config_path
    done = cli("enqueue", "-c", str(config), "--queue", "bp", "t", "{}")
    assert done.returncode == 75, done.stderr
    assert "queue bp is full: 2 pending, max_pending 2" in done.stderr
    done = cli("stats", "-c", str(config), "--queue", "bp", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert (row["pending"], row["max_pending"], row["refused"]) == (2, 2, 5)
    table = cli("stats", "-c", str(config), "--queue", "bp").stdout.splitlines()
    assert table[0].split()[-2:] == ["MAX_PENDING", "REFUSED"]
    assert table[1].split()[-2:] == ["2", "5"]

    # A reload changes the bound; one taken out of the file is lifted.
    text = json.loads(config.read_text())
    config.write_text(json.dumps({**text, "max_pending": {"bp": 3}}))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: r.hget(q.keys.settings, "max_pending") == b"3", what="the reload to write the new bound")
    assert post(f"{base}/v1/jobs", job, JSON)[0] == 201
    del text["max_pending"]
    config.write_text(json.dumps(text))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: r.hget(q.keys.settings, "max_pending") is None, what="the reload to lift the bound")
    assert post(f"{base}/v1/jobs", job, JSON)[0] == 201
    assert stats(q) == (4, None, 5)


# -- per-type bounds: the settings the daemons write, and how stats, --json and the metrics show them ---------------


def test_configured_bounds_go_to_the_literal_queues_and_a_daemon_lifts_only_its_own() -> None:
    config = parse_config(
        "queues: {bp: 1, 'tenant-*': 1}\nmax_pending: {bp: 10}\nhandlers:\n"
        "  email: {url: 'http://h/', max_pending: 100}\n  plain: {url: 'http://h/'}\n",
        "jobcar.yaml",
        {},
    )
    bp, tenant = QueueKeys.of("ns", "bp"), QueueKeys.of("ns", "tenant-1")
    assert type_bound_field("email") == "max_pending:email"
    assert configured_bounds(config, "bp") == {"max_pending": 10, "max_pending:email": 100}
    assert configured_bounds(config, "tenant-1") == {}, "a queue served by pattern gets no bound, as max_pending"
    # Its types' bounds, and those of the types it wrote before and runs no more; never another daemon's types',
    # nor `refused`, every producer's count; on a queue served by pattern, only the queue's own bound.
    assert settings_commands([bp, tenant], config, {"gone"}) == [
        ("HSET", bp.settings, "max_pending", "10", "max_pending:email", "100"),
        ("HDEL", bp.settings, "max_pending:gone", "max_pending:plain"),
        ("HDEL", tenant.settings, "max_pending"),
    ]


def test_stats_read_each_types_count_and_bound(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> None:
    q = QueueDriver(any_redis, namespace)
    empty = parse_stats(q.keys, q.run(stats_call(q.keys)))
    assert (empty.pending_counts, empty.max_pending_by_type) == ({}, {})
    # Written by hand: this reads the counts and bounds as the scripts and the daemons leave them.
    any_redis.hset(q.keys.pending_counts, mapping={"email": 12, "resize": 3})
    bounds = {"email": 100, "sms": 5, "bad": "many", "zero": 0}
    any_redis.hset(q.keys.settings, mapping={type_bound_field(t): n for t, n in bounds.items()} | {"refused": 4})
    reply = q.run(stats_call(q.keys))
    assert [x.decode() if isinstance(x, bytes) else x for x in reply[12]] == [
        "bad", 0, -1, "email", 12, 100, "resize", 3, -1, "sms", 0, 5, "zero", 0, -1,
    ]  # fmt: skip
    s = parse_stats(q.keys, reply)
    assert s.pending_counts == {"email": 12, "resize": 3}
    assert s.max_pending_by_type == {"email": 100, "sms": 5}, "a field that is no bound bounds nothing"
    assert (s.max_pending, s.refused) == (None, 4)
    assert stats_document(s, QueueHistory(q.keys.queue, s.now_ms, {}))["max_pending_by_type"] == {
        "email": {"count": 12, "max_pending": 100},
        "sms": {"count": 0, "max_pending": 5},
    }

    # Keys of another type (fsck reports them) read as empty: the rest of the stats still answer.
    any_redis.delete(q.keys.pending_counts, q.keys.settings)
    any_redis.set(q.keys.pending_counts, "x")
    any_redis.set(q.keys.settings, "x")
    s = parse_stats(q.keys, q.run(stats_call(q.keys)))
    assert (s.pending_counts, s.max_pending_by_type, s.max_pending, s.refused) == ({}, {}, None, 0)


def test_the_daemon_writes_each_types_bound_lifts_it_on_reload_and_shows_it(
    start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    q = QueueDriver(r, namespace, "bp")
    q.run(pause_call(q.keys, True))  # nothing is leased
    # A bound of a type it runs unbounded goes; a type it does not run is another daemon's (it stays), and every
    # producer's refusals stay.
    r.hset(q.keys.settings, mapping={type_bound_field("plain"): 9, type_bound_field("other"): 7, "refused": 3})
    handlers = {
        "email": {"url": "http://127.0.0.1:9/email", "max_pending": 100},
        "resize": {"command": ["true"], "max_pending": 5},
        "plain": {"url": "http://127.0.0.1:9/plain"},
    }
    daemon = start_daemon(handlers, queues={"bp": 1})
    want = {type_bound_field("email"): b"100", type_bound_field("resize"): b"5", type_bound_field("other"): b"7",
            "refused": b"3"}  # fmt: skip
    wait_for(lambda: {k.decode(): v for k, v in r.hgetall(q.keys.settings).items()} == want,
             what="the daemon to write its types' bounds and lift its own stale one")  # fmt: skip
    daemon.wait_for_log("max_pending:email 100 written")

    # The API's 429 names the type whose bound refused the call.
    base = listen_url(daemon)
    resize = json.dumps({"jobs": [{"type": "resize", "queue": "bp"}] * 6}).encode()
    status, body = post(f"{base}/v1/jobs", resize, JSON)
    assert status == 429
    assert (body["type"], body["pending"], body["max_pending"], body["refused"]) == ("resize", 0, 5, 6)
    assert "0 pending of type resize, max_pending 5" in body["error"]
    r.hset(q.keys.settings, "refused", 3)

    # The counts as the scripts keep them, written by hand: the reading is what is tested here.
    r.hset(q.keys.pending_counts, mapping={"email": 12, "plain": 2})
    config = daemon.config_path
    done = cli("stats", "-c", str(config), "--queue", "bp", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["max_pending_by_type"] == {
        "email": {"count": 12, "max_pending": 100},
        "resize": {"count": 0, "max_pending": 5},
        "other": {"count": 0, "max_pending": 7},
    }, "only the bounded types, another daemon's too"
    lines = cli("stats", "-c", str(config), "--queue", "bp").stdout.splitlines()
    assert lines[2:] == ["bp: email 12 of max_pending 100", "bp: other 0 of max_pending 7",
                         "bp: resize 0 of max_pending 5"]  # fmt: skip
    samples = scrape(listen_url(daemon))
    assert value(samples, "jobcar_type_max_pending", queue="bp", type="email") == 100
    assert value(samples, "jobcar_type_pending_jobs", queue="bp", type="email") == 12
    assert value(samples, "jobcar_type_max_pending", queue="bp", type="resize") == 5
    assert value(samples, "jobcar_type_pending_jobs", queue="bp", type="resize") == 0
    assert not [key for key in samples if key[0].startswith("jobcar_type_") and ("type", "plain") in key[1]]

    # A reload changes one bound and lifts the other, with its handler gone: the field goes, and so do its series.
    text = json.loads(config.read_text())
    text["handlers"]["email"]["max_pending"] = 50
    del text["handlers"]["resize"]
    config.write_text(json.dumps(text))
    daemon.signal(signal.SIGHUP)
    want = {type_bound_field("email"): b"50", type_bound_field("other"): b"7", "refused": b"3"}
    wait_for(lambda: {k.decode(): v for k, v in r.hgetall(q.keys.settings).items()} == want,
             what="the reload to change one bound and lift the other")  # fmt: skip

    def series() -> dict[str, float]:
        return {f"{name} {dict(labels)['type']}": n for (name, labels), n in scrape(listen_url(daemon)).items()
                if name.startswith("jobcar_type_")}  # fmt: skip

    want_series = {"jobcar_type_max_pending email": 50, "jobcar_type_pending_jobs email": 12}
    wait_for(lambda: series() == want_series, what="the metrics to follow the reload")
