"""One bad key never stops a queue (guarantee #9 of docs/delivery-semantics.md): a job id whose key holds
another Redis type, a job hash without a type, a queue key of the wrong type. Real daemons on a real server;
the keys are written by hand, as a bug or another program would."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from jobcar import State
from tests.integration.daemon_harness import DaemonProcess, handler_server, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.servers import RedisServer, wait_for

OK: tuple[int, dict[str, str], bytes] = (200, {}, b"")


def fsck(config: Path, *extra: str) -> list[dict[str, Any]]:
    done = cli("fsck", "--json", *extra, "-c", str(config))
    findings: list[dict[str, Any]] = json.loads(done.stdout) if done.stdout.strip() else []
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == (1 if findings and not extra else 0), (done.returncode, done.stdout, done.stderr)
    return findings


def logged(daemon: DaemonProcess, fragment: str) -> list[dict[str, Any]]:
    return [line for line in daemon.lines() if fragment in line.get("msg", "")]


def ran(handlers: Any, path: str) -> set[str]:
    return {r.headers["jobcar-job-id"] for r in handlers.requests_to(path)}


def test_a_pending_id_whose_key_holds_a_string_is_dropped_and_the_good_jobs_run(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Before: the lease script failed with WRONGTYPE after popping the batch; the daemon retried it as an
    outage forever, and the good jobs popped with the bad id were left nowhere."""
    with handler_server() as handlers, redis_server.client() as client:
        config = write_config(tmp_path, redis_server.url, namespace, {"t": {"url": handlers.url("/t", lambda r: OK)}})
        q = QueueDriver(client, namespace)
        client.set(q.keys.paused, "1")  # the bad id goes in among good ones before any lease
        good = [q.enqueue("t", n).id for n in range(5)]
        client.set(q.keys.job("poison"), "not a hash")
        client.lpush(q.keys.pending, "poison")
        good += [q.enqueue("t", n).id for n in range(5, 10)]
        due_poison = q.keys.job("due-poison")
        client.rpush(due_poison, "a list")
        client.zadd(q.keys.scheduled, {"due-poison": 1})  # due long ago: the lease promotes what is due
        daemon = DaemonProcess(config).start()
        try:
            assert cli("queue", "resume", "default", "-c", str(config)).returncode == 0
            wait_for(lambda: ran(handlers, "/t") == set(good), what="every good job to run")
            wait_for(lambda: all(q.job(i) is None for i in good), what="every good job to be acked")
            dropped = daemon.wait_for_log("job id dropped from the pending list")
            assert dropped["job_id"] == "poison"
            assert "its key holds a string, not a job hash" in dropped["msg"]
            assert not logged(daemon, "unreachable")
            assert client.llen(q.keys.pending) == 0
            assert client.zcard(q.keys.active) == 0
            assert client.zcard(q.keys.scheduled) == 0
            assert client.get(q.keys.job("poison")) == b"not a hash", "what the key held is fsck's to remove"

            found = fsck(config)
            assert sorted((f["kind"], f["id"]) for f in found) == [
                ("wrong_type", due_poison),
                ("wrong_type", q.keys.job("poison")),
            ]
            repaired = fsck(config, "--repair")
            assert all(f["repaired"] for f in repaired), repaired
            assert not client.exists(q.keys.job("poison"), due_poison)
            assert fsck(config) == []
        finally:
            daemon.stop()


def test_a_job_hash_without_a_type_goes_to_the_dead_letter_queue(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Before: it was dropped from the list as if its hash were missing, and fsck --repair put it back,
    forever. docs/protocol.md promises the dead-letter queue with a `malformed job:` reason."""
    with handler_server() as handlers, redis_server.client() as client:
        config = write_config(tmp_path, redis_server.url, namespace, {"t": {"url": handlers.url("/t", lambda r: OK)}})
        q = QueueDriver(client, namespace)
        client.hset(q.keys.job("untyped"), mapping={"payload": "{}", "state": "pending", "created": 1})
        client.lpush(q.keys.pending, "untyped")
        good = q.enqueue("t", 1).id
        daemon = DaemonProcess(config).start()
        try:
            wait_for(lambda: q.where("untyped") is State.DEAD, what="the untyped job in the dead-letter queue")
            job = q.job("untyped")
            assert job is not None
            assert job.last_error == "malformed job: the job has no type"
            wait_for(lambda: q.job(good) is None, what="the good job to be done")
            assert not logged(daemon, "has no job hash")
            assert fsck(config) == []
        finally:
            daemon.stop()


def test_a_queue_key_of_the_wrong_type_stops_only_its_queue_and_nothing_is_half_written(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Queue a's scheduled key holds a string. Its scripts refuse before their first write; the daemon says
    Redis refused (not that it is unreachable) and leases from queue b meanwhile; fsck --repair clears it."""
    with handler_server() as handlers, redis_server.client() as client:
        route = {"t": {"url": handlers.url("/t", lambda r: OK)}}
        config = write_config(tmp_path, redis_server.url, namespace, route, queues={"a": 1, "b": 1})
        a, b = QueueDriver(client, namespace, "a"), QueueDriver(client, namespace, "b")
        stuck = a.enqueue("t", 1).id
        client.set(a.keys.scheduled, "not a sorted set")
        daemon = DaemonProcess(config).start()
        try:
            daemon.wait_for_log("redis refused a call: WRONGTYPE jobcar:")
            done_in_b = [b.enqueue("t", n).id for n in range(10)]
            wait_for(lambda: ran(handlers, "/t") == set(done_in_b), what="queue b's jobs to run")
            assert not logged(daemon, "unreachable")
            refused = logged(daemon, "redis refused a call")
            assert len(refused) == 1, "logged once, not at every try"
            assert f"{a.keys.scheduled} holds a string, not a zset" in refused[0]["msg"]
            assert client.lrange(a.keys.pending, 0, -1) == [stuck.encode()], "nothing popped, nothing half-done"
            assert client.hget(a.keys.job(stuck), "state") == b"pending"
            # An enqueue to the broken queue is refused whole, with the same words.
            with pytest.raises(redis.ResponseError, match="holds a string, not a zset"):
                a.enqueue("t", 2, delay=60)
            assert client.lrange(a.keys.pending, 0, -1) == [stuck.encode()]

            found = fsck(config)
            assert [(f["queue"], f["kind"], f["id"]) for f in found] == [("a", "wrong_type", a.keys.scheduled)]
            fsck(config, "--repair")
            wait_for(lambda: stuck in ran(handlers, "/t"), timeout=30, what="queue a's job to run after the repair")
            assert daemon.process is not None
            assert daemon.process.poll() is None
        finally:
            daemon.signal(signal.SIGTERM)
            daemon.stop()


def test_a_refusing_queue_leaves_the_other_queues_reaped_and_their_leases_renewed(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Queue a's active key turns into a string while a job of each queue runs: a's renewals and reaps are
    refused, b's go on. Before, one refusal failed the whole heartbeat (every queue's attempts were then
    abandoned) and the whole reap pass."""
    gate = threading.Event()

    def hold(req: Any) -> tuple[int, dict[str, str], bytes]:
        gate.wait(60)
        return OK

    with handler_server() as handlers, redis_server.client() as client:
        route = {"t": {"url": handlers.url("/t", hold)}}
        config = write_config(tmp_path, redis_server.url, namespace, route, queues={"a": 1, "b": 1}, lease="3s")
        a, b = QueueDriver(client, namespace, "a"), QueueDriver(client, namespace, "b")
        expired = b.enqueue("t", 0).id
        b.lease_one(lease_ms=1)  # a lease nobody renews: the daemon's reaper must recover it
        daemon = DaemonProcess(config).start()
        try:
            in_a, in_b = a.enqueue("t", 1).id, b.enqueue("t", 2).id
            wait_for(lambda: {expired, in_a, in_b} <= ran(handlers, "/t"), what="a job of each queue running")
            first_deadline = client.zscore(b.keys.active, in_b)
            assert first_deadline is not None
            client.delete(a.keys.active)
            client.set(a.keys.active, "not a sorted set")
            refused = daemon.wait_for_log(f"{a.keys.active} holds a string, not a zset")
            assert refused["msg"].startswith("redis refused a call: WRONGTYPE jobcar:")
            # b's lease is renewed past its first deadline while a's renewals are refused.
            wait_for(lambda: (client.zscore(b.keys.active, in_b) or 0) > first_deadline + 3000, timeout=20,
                     what="b's lease renewed beyond a whole lease")  # fmt: skip
            gate.set()
            wait_for(lambda: b.job(in_b) is None and b.job(expired) is None, what="b's jobs done")
            attempts_of_b = [
                r.headers["jobcar-attempt"] for r in handlers.requests_to("/t") if r.headers["jobcar-job-id"] == in_b
            ]
            assert attempts_of_b == ["1"], "b's job ran once: its lease was never lost"
            assert not logged(daemon, "unreachable")
            assert not [line for line in logged(daemon, "abandoning the attempt") if line.get("job_id") == in_b]
        finally:
            gate.set()
            daemon.stop()


def test_a_settled_list_of_another_type_refuses_the_ack_naming_it_until_fsck_repairs_it(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Queue a's settled list holds a string: the ack of a job that b's job waits for is refused, not done
    without telling b's job; every WRONGTYPE line names the key. After fsck --repair the ack goes through and
    the waiting job runs."""
    with handler_server() as handlers, redis_server.client() as client:
        route = {"t": {"url": handlers.url("/t", lambda r: OK)}}
        config = write_config(tmp_path, redis_server.url, namespace, route, queues={"a": 1, "b": 1})
        a, b = QueueDriver(client, namespace, "a"), QueueDriver(client, namespace, "b")
        client.set(a.keys.settled, "not a list")
        first = a.enqueue("t", 1)
        waiting = b.enqueue("t", 2, after=[first])
        daemon = DaemonProcess(config).start()
        try:
            daemon.wait_for_log(f"{a.keys.settled} holds a")
            wait_for(lambda: first.id in ran(handlers, "/t"), what="a's job to run")
            assert b.where(waiting.id) is State.WAITING
            lines = logged(daemon, "WRONGTYPE")
            assert lines
            assert all(a.keys.settled in line["msg"] for line in lines), lines
            assert ("a", "wrong_type", a.keys.settled) in [(f["queue"], f["kind"], f["id"]) for f in fsck(config)]
            fsck(config, "--repair")
            wait_for(lambda: waiting.id in ran(handlers, "/t"), timeout=30, what="b's job to run after the repair")
        finally:
            daemon.signal(signal.SIGTERM)
            daemon.stop()


FAILED_FOR_GOOD: tuple[int, dict[str, str], bytes] = (400, {}, b"bad input")


def test_a_settled_list_of_another_type_refuses_the_kill_of_a_job_others_wait_for_until_fsck_repairs_it(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """As for an ack: a failed job that b's job waits for is not killed without telling it. The job stays
    active while the daemon tries again; every WRONGTYPE line names the key; after fsck --repair the kill
    (or the reap of its lease) goes through and the waiting job is told."""
    with handler_server() as handlers, redis_server.client() as client:
        route = {"t": {"url": handlers.url("/t", lambda r: FAILED_FOR_GOOD)}}
        config = write_config(tmp_path, redis_server.url, namespace, route, queues={"a": 1, "b": 1})
        a, b = QueueDriver(client, namespace, "a"), QueueDriver(client, namespace, "b")
        client.set(a.keys.settled, "not a list")
        first = a.enqueue("t", 1, max_attempts=1)
        waiting = b.enqueue("t", 2, after=[first])
        daemon = DaemonProcess(config).start()
        try:
            daemon.wait_for_log(f"{a.keys.settled} holds a string")  # the kill's refusal (the settler's look: another)
            assert a.where(first.id) is State.ACTIVE, "not dead without telling"
            assert b.where(waiting.id) is State.WAITING
            lines = logged(daemon, "WRONGTYPE")
            assert lines
            assert all(a.keys.settled in line["msg"] for line in lines), lines
            fsck(config, "--repair")
            wait_for(lambda: b.where(waiting.id) is State.DEAD, timeout=60, what="b's job told its dependency died")
            assert a.where(first.id) is State.DEAD
        finally:
            daemon.signal(signal.SIGTERM)
            daemon.stop()


def test_a_settle_refused_by_the_waiting_jobs_settled_list_keeps_the_entry_until_fsck_repairs_it(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """x (a) <- y (b) <- z (a), b's settled list holds a string: x dies, and telling y (which would die too)
    is refused, naming the key. The entry stays in a's settled list, rather than being dropped with y left
    waiting for ever; after fsck --repair y dies, and so does z."""
    with handler_server() as handlers, redis_server.client() as client:
        route = {"t": {"url": handlers.url("/t", lambda r: FAILED_FOR_GOOD)}}
        config = write_config(tmp_path, redis_server.url, namespace, route, queues={"a": 1, "b": 1})
        a, b = QueueDriver(client, namespace, "a"), QueueDriver(client, namespace, "b")
        client.set(b.keys.settled, "not a list")
        x = a.enqueue("t", 1, max_attempts=1)
        y = b.enqueue("t", 2, after=[x])
        z = a.enqueue("t", 3, after=[y])
        daemon = DaemonProcess(config).start()
        try:
            daemon.wait_for_log("could not settle a dependency")
            assert logged(daemon, "could not settle")[0]["msg"].count(b.keys.settled) == 1
            assert a.where(x.id) is State.DEAD
            assert b.where(y.id) is State.WAITING
            assert client.llen(a.keys.settled) == 1, "the entry is kept"
            lines = logged(daemon, "WRONGTYPE")
            assert all(b.keys.settled in line["msg"] for line in lines), lines
            fsck(config, "--repair")
            wait_for(lambda: a.where(z.id) is State.DEAD, timeout=30, what="y, then z, told")
            assert b.where(y.id) is State.DEAD
        finally:
            daemon.signal(signal.SIGTERM)
            daemon.stop()
