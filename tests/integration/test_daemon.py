"""End to end: `jobcar run` as a real process, real HTTP handlers and real programs, every outcome."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import redis

from jobcar import Client, State, transitions
from tests.factories import python_handler
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import (
    DaemonProcess,
    HandlerServer,
    Received,
    wait_gone,
    wait_state,
    write_config,
)
from tests.integration.driver import QueueDriver
from tests.integration.lease_probe import LeaseMonitor, queued_behind_waits, wait_for_a_queued_lease
from tests.servers import RedisServer, wait_for


def ok(req: Received) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, b"done:" + req.body


def blocked_clients(client: redis.Redis) -> int:
    """Connections waiting in BLMOVE: the daemon's idle queues."""
    return sum(1 for c in client.client_list() if c.get("cmd") == "blmove")


def test_http_success_gets_the_exact_bytes_and_metadata(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    url = handlers.url("/jobs/ok", ok)
    daemon = start_daemon({"email.welcome": {"url": url}})
    raw = b"\x00\xff binary; $(rm -rf /) \x80"
    info = q.enqueue("email.welcome", raw, content_type="application/x-test", max_attempts=4)
    wait_gone(q, info.id, daemon)
    [req] = handlers.requests_to("/jobs/ok")
    assert req.body == raw
    assert req.headers["content-type"] == "application/x-test"
    assert req.headers["jobcar-job-id"] == info.id
    assert req.headers["jobcar-job-type"] == "email.welcome"
    assert req.headers["jobcar-queue"] == "default"
    assert (req.headers["jobcar-attempt"], req.headers["jobcar-max-attempts"]) == ("1", "4")
    assert req.headers["jobcar-enqueued-at"].endswith("Z")
    assert req.headers["jobcar-deadline"].endswith("Z")


def test_http_5xx_retries_with_backoff_then_dead_with_every_error(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    url = handlers.url("/jobs/broken", lambda req: (500, {}, f"broken #{req.headers['jobcar-attempt']}".encode()))
    daemon = start_daemon({"always.fails": {"url": url, "max_attempts": 3}})
    info = q.enqueue("always.fails", {"n": 1})
    wait_state(q, info.id, State.DEAD, daemon)
    job = q.job(info.id)
    assert job is not None
    assert job.attempt == 3
    assert [e.attempt for e in job.errors] == [1, 2, 3]
    assert all("500" in e.error for e in job.errors)
    assert "broken #3" in job.errors[-1].error
    assert "attempts exhausted: 3 of 3" in job.errors[-1].error
    assert len(handlers.requests_to("/jobs/broken")) == 3


def test_http_4xx_goes_to_the_dead_letter_queue_after_one_attempt(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    url = handlers.url("/jobs/reject", lambda req: (422, {}, b"invalid order"))
    daemon = start_daemon({"order.check": {"url": url}})
    info = q.enqueue("order.check", {})
    wait_state(q, info.id, State.DEAD, daemon)
    job = q.job(info.id)
    assert job is not None
    assert job.attempt == 1
    assert "422" in (job.last_error or "")
    assert "invalid order" in (job.last_error or "")


def test_http_429_with_retry_after_waits_and_spends_no_attempt(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    def busy_once(req: Received) -> tuple[int, dict[str, str], bytes]:
        if len(handlers.requests_to("/jobs/busy")) == 1:
            return 429, {"Retry-After": "1"}, b"slow down"
        return 200, {}, b""

    daemon = start_daemon({"rate.limited": {"url": handlers.url("/jobs/busy", busy_once), "max_attempts": 1}})
    info = q.enqueue("rate.limited", {})
    wait_gone(q, info.id, daemon)
    first, second = handlers.requests_to("/jobs/busy")
    assert second.at - first.at >= 0.95, "Retry-After: 1 honoured"
    assert first.headers["jobcar-attempt"] == second.headers["jobcar-attempt"] == "1", "no attempt spent"


def test_unknown_type_goes_to_the_dead_letter_queue_never_dropped(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    daemon = start_daemon({"known": {"url": handlers.url("/jobs/ok", ok)}})
    info = q.enqueue("nobody.handles.this", {"x": 1})
    wait_state(q, info.id, State.DEAD, daemon)
    job = q.job(info.id)
    assert job is not None
    assert job.last_error == "no handler for type nobody.handles.this"
    assert job.payload == b'{"x":1}', "the job is kept whole for a later requeue"


def test_command_outcomes(tmp_path: Path, start_daemon: StartDaemon, q: QueueDriver) -> None:
    echo = python_handler(tmp_path, "echo.py", "data = sys.stdin.buffer.read(); sys.stdout.buffer.write(data)")
    flaky = python_handler(tmp_path, "flaky.py", "sys.stderr.write('attempt ' + os.environ['JOBCAR_ATTEMPT']); "
                   "sys.exit(0 if os.environ['JOBCAR_ATTEMPT'] == '2' else 3)")  # fmt: skip
    bad = python_handler(tmp_path, "bad.py", "sys.stderr.write('cannot parse input'); sys.exit(65)")
    daemon = start_daemon(
        {
            "echo": {"command": echo},
            "flaky": {"command": flaky},
            "bad": {"command": bad, "permanent_exit_codes": [65]},
        },
        result_ttl="1h",
    )
    echoed = q.enqueue("echo", b"; `id` $(touch /tmp/pwned)\x00", content_type="text/plain")
    retried = q.enqueue("flaky", None)
    dead = q.enqueue("bad", None)
    wait_state(q, echoed.id, State.DONE, daemon)
    done = q.job(echoed.id)
    assert done is not None
    assert done.result == b"; `id` $(touch /tmp/pwned)\x00"
    wait_state(q, retried.id, State.DONE, daemon)
    flaky_job = q.job(retried.id)
    assert flaky_job is not None
    assert flaky_job.attempt == 2
    assert "exit code 3" in flaky_job.errors[0].error
    assert "attempt 1" in flaky_job.errors[0].error
    wait_state(q, dead.id, State.DEAD, daemon)
    dead_job = q.job(dead.id)
    assert dead_job is not None
    assert dead_job.attempt == 1
    assert "cannot parse input" in (dead_job.last_error or "")


def test_delayed_job_runs_when_due_not_at_the_next_poll(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    daemon = start_daemon({"later": {"url": handlers.url("/jobs/later", ok)}})
    wait_for(lambda: blocked_clients(q.redis) >= 1, what="the daemon to block on its idle queue")
    enqueued = time.monotonic()
    info = q.enqueue("later", {}, delay=0.5)
    wait_gone(q, info.id, daemon)
    lateness = handlers.requests_to("/jobs/later")[0].at - enqueued - 0.5
    # Never early; and woken by its own timer, well before the idle safety poll (5 s) would run it.
    # (Lateness figures live in bench/, not here.)
    assert -0.01 <= lateness < 3, lateness


def test_idle_daemon_blocks_instead_of_polling(
    handlers: HandlerServer, server_binary: str, tmp_path: Path, namespace: str
) -> None:
    """At most 5 Redis commands/s per queue while idle, read from INFO commandstats."""
    server = RedisServer(server_binary, tmp_path / "idle").start()
    path = write_config(tmp_path, server.url, namespace, {"x": {"url": handlers.url("/jobs/ok", ok)}},
                        queues={"a": 1, "b": 1, "c": 1}, lease="30s")  # fmt: skip
    daemon = DaemonProcess(path).start()
    try:
        with server.client() as probe:

            def calls() -> int:
                return sum(int(v["calls"]) for k, v in probe.info("commandstats").items() if "info" not in k)

            wait_for(lambda: blocked_clients(probe) == 3, what="the daemon to block on its 3 idle queues")
            assert queued_behind_waits(probe) == [0, 0, 0], "several queues: plain waits (ADR 0005)"
            before, started = calls(), time.monotonic()
            time.sleep(6)  # the measurement window (longer than the 5 s idle safety interval), not a wait
            rate = (calls() - before) / (time.monotonic() - started) / 3
            assert rate <= 5, f"{rate:.2f} commands/s per queue while idle"
            info = Client(probe, namespace=namespace).enqueue("x", {}, queue="b")
            wait_for(lambda: QueueDriver(probe, namespace, "b").job(info.id) is None, what="the job to run")
    finally:
        daemon.stop()
        server.stop()


def test_a_one_queue_daemon_leases_behind_its_idle_wait(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver, redis_server: RedisServer
) -> None:
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}})
    with LeaseMonitor(redis_server) as monitor:
        for n in range(3):
            wait_for_a_queued_lease(q.redis, monitor)
            job = q.enqueue("t", n).id
            wait_gone(q, job, daemon)
            assert monitor.queued_lease_took(job)
    assert len(handlers.requests_to("/jobs/ok")) == 3


def test_a_lease_queued_behind_the_wait_is_loaded_again_when_the_server_forgot_its_script(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver, redis_server: RedisServer
) -> None:
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}})
    with LeaseMonitor(redis_server) as monitor:
        wait_for_a_queued_lease(q.redis, monitor)
    q.redis.script_flush()  # as after a failover to a replica that never ran jobcar's scripts
    job = q.enqueue("t", 1).id
    wait_gone(q, job, daemon)
    unreachable = [line for line in daemon.lines() if "unreachable" in str(line.get("msg"))]
    assert not unreachable, "NOSCRIPT behind a wait is not an outage: the lease is loaded and sent again"


def test_a_one_queue_daemon_on_a_unix_socket_leases_behind_its_idle_wait(
    handlers: HandlerServer, server_binary: str, tmp_path: Path, namespace: str
) -> None:
    # `make run`'s embedded server listens on a unix socket: its connections are not redis-py's
    # `Connection` class, and the watcher's kept connection must serve them the same.
    with tempfile.TemporaryDirectory(prefix="jc") as short:  # socket paths are limited to ~100 bytes
        socket = Path(short) / "redis.sock"
        server = RedisServer(server_binary, tmp_path / "unix", extra_args=("--unixsocket", str(socket))).start()
        path = write_config(tmp_path, f"unix://{socket}?db=0", namespace, {"t": {"url": handlers.url("/jobs/ok", ok)}})
        daemon = DaemonProcess(path).start()
        try:
            with server.client() as probe, LeaseMonitor(server) as monitor:
                driver = QueueDriver(probe, namespace)
                for n in range(2):
                    wait_for_a_queued_lease(probe, monitor)
                    job = driver.enqueue("t", n).id
                    wait_gone(driver, job, daemon)
                    assert monitor.queued_lease_took(job)
            assert not [line for line in daemon.lines() if line["level"] == "error"], daemon.log_tail()
        finally:
            daemon.stop()
            server.stop()


def test_app_health_gates_leasing(handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver) -> None:
    """While the app's health URL fails, jobs stay pending instead of burning attempts."""
    healthy = {"now": False}
    handlers.routes["/health"] = lambda req: (200 if healthy["now"] else 503, {}, b"")
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}}, health_url=handlers.base_url + "/health")
    info = q.enqueue("t", {})
    daemon.wait_for_log("jobcar running")
    wait_for(lambda: len(handlers.requests_to("/health")) >= 2, what="two failed health probes")
    assert q.where(info.id) is State.PENDING
    assert handlers.requests_to("/jobs/ok") == []
    healthy["now"] = True
    wait_gone(q, info.id, daemon)
    daemon.wait_for_log("app healthy")


def test_a_job_leased_after_the_app_turned_unhealthy_goes_back_unrun(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver, redis_server: RedisServer
) -> None:
    """The lease queued behind the idle wait (ADR 0005) was sent while the app was healthy and takes the
    next job whenever it comes; no handler may start against an app now known to be unhealthy."""
    healthy = {"now": True}
    handlers.routes["/health"] = lambda req: (200 if healthy["now"] else 503, {}, b"")
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}}, health_url=handlers.base_url + "/health")
    daemon.wait_for_log("app healthy")

    with LeaseMonitor(redis_server) as monitor:
        # Where the server hides the queued bytes (Valkey), a wait re-armed right after a queued lease ran
        # has one behind it too: the app is healthy and the alive key fresh.
        wait_for_a_queued_lease(q.redis, monitor)

        def just_queued() -> bool:  # a lease behind a wait that began under a second ago: 4 s before it ends
            return any(c.get("cmd") == "blmove" and int(c["idle"]) == 0 and (int(c["qbuf"]) > 0 or monitor.leases())
                       for c in q.redis.client_list())  # fmt: skip

        wait_for(just_queued, what="a lease freshly queued behind the idle wait")
        healthy["now"] = False
        daemon.wait_for_log("app unhealthy")
        info = q.enqueue("t", {})
        assert monitor.queued_lease_took(info.id)
    daemon.wait_for_log("returned to pending: the app is unhealthy")
    wait_for(lambda: q.where(info.id) is State.PENDING, what="the job back in pending")
    job = q.job(info.id)
    assert job is not None
    assert job.attempt == 0, "the attempt that never ran is given back"
    assert q.where(info.id) is State.PENDING, "and it stays there while the app is unhealthy"
    assert handlers.requests_to("/jobs/ok") == []
    healthy["now"] = True
    wait_gone(q, info.id, daemon)


def test_handler_concurrency_bounds_parallel_runs(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    running = {"now": 0, "most": 0}
    lock = threading.Lock()  # the handler server answers each request on its own thread

    def slow(req: Received) -> tuple[int, dict[str, str], bytes]:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.1)  # the handler's own work: long enough for runs to overlap if allowed
        with lock:
            running["now"] -= 1
        return 200, {}, b""

    daemon = start_daemon({"limited": {"url": handlers.url("/jobs/slow", slow), "concurrency": 2}}, concurrency=10)
    ids = [i.id for i in q.producer.enqueue_many([("limited", n) for n in range(8)])]
    for job_id in ids:
        wait_gone(q, job_id, daemon)
    assert running["most"] == 2


def test_strict_priority_drains_queues_in_order(
    handlers: HandlerServer, start_daemon: StartDaemon, r: redis.Redis, namespace: str
) -> None:
    url = handlers.url("/jobs/ok", ok)
    low, critical = QueueDriver(r, namespace, "low"), QueueDriver(r, namespace, "critical")
    low_ids = [low.enqueue("t", n).id for n in range(10)]
    critical_ids = [critical.enqueue("t", n).id for n in range(10)]
    daemon = start_daemon({"t": {"url": url}}, queues={"critical": 2, "low": 1}, strict_priority=True, concurrency=1)
    for job_id in low_ids:
        wait_gone(low, job_id, daemon)
    order = [req.headers["jobcar-queue"] for req in handlers.requests_to("/jobs/ok")]
    assert order == ["critical"] * 10 + ["low"] * 10
    assert all(critical.job(i) is None for i in critical_ids)


def test_a_job_canceled_before_its_next_attempt_is_not_run_again(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    """The cancel flag set on a running attempt survives its retry; the next lease honours it."""
    info = q.enqueue("t", {})
    leased = q.lease_one()
    q.run(transitions.cancel_call(q.keys, info.id))
    assert q.retry(info.id, leased.token, delay_ms=0) == 1
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}}, result_ttl="1h")
    wait_state(q, info.id, State.CANCELED, daemon)
    assert handlers.requests_to("/jobs/ok") == []


def test_a_malformed_job_hash_goes_to_the_dead_letter_queue(
    handlers: HandlerServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    """A hash written around the enqueue script (corruption, a buggy producer) must not stop the daemon."""
    q.redis.hset(q.keys.job("broken"), mapping={"type": "t", "payload": "{}", "state": "pending", "created": "x"})
    q.redis.lpush(q.keys.pending, "broken")
    good = q.enqueue("t", {}).id
    daemon = start_daemon({"t": {"url": handlers.url("/jobs/ok", ok)}})
    wait_gone(q, good, daemon)
    wait_for(lambda: q.redis.zscore(q.keys.dead, "broken") is not None, what="the malformed job in the DLQ")
    errors = q.redis.hget(q.keys.job("broken"), "errors") or b""
    assert b"malformed job" in errors
