"""The daemon's lifecycle with real signals: drain, reload, Redis going away, start-up checks."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from jobcar import State
from tests.faultproxy import FaultProxy
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (zombies run nothing; our PID 1 reaps late)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


def sleeper(tmp_path: Path, pids: Path) -> str:
    """A handler that records its pid and sleeps for a minute unless told otherwise by its payload."""
    path = tmp_path / "sleeper.py"
    path.write_text(
        "import json, os, sys, time\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "payload = json.loads(sys.stdin.read() or 'null') or {}\n"
        "time.sleep(payload.get('sleep', 60))\n"
    )
    return str(path)


def test_sigterm_drains_finishes_what_it_can_and_gives_the_rest_back(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    handler = {"command": [sys.executable, sleeper(tmp_path, pids)], "kill_grace": "1s"}
    config = write_config(tmp_path, redis_server.url, namespace, {"work": handler},
                          concurrency=20, shutdown_timeout="3s")  # fmt: skip
    daemon = DaemonProcess(config).start()
    with redis_server.client() as client:
        q = QueueDriver(client, namespace)
        quick = [q.enqueue("work", {"sleep": 1}).id for _ in range(5)]
        slow = [q.enqueue("work", {"sleep": 60}).id for _ in range(15)]
        wait_for(lambda: client.zcard(q.keys.active) == 20, what="20 jobs in flight")
        wait_for(lambda: len(pids.read_text().split()) == 20, what="20 handlers started")
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        late = q.enqueue("work", {"sleep": 0}).id
        assert daemon.wait(timeout=30) == 0
        elapsed = time.monotonic() - started
        assert elapsed < 3 + 1 + 3, f"exit took {elapsed:.1f} s (shutdown_timeout 3 s, kill_grace 1 s)"
        for job_id in quick:
            assert q.job(job_id) is None, "jobs that finish within shutdown_timeout are acked"
        for job_id in slow:
            job = q.job(job_id)
            assert job is not None
            assert q.where(job_id) is State.PENDING
            assert job.attempt == 0, "an interrupted attempt is given back"
        assert q.where(late) is State.PENDING, "no lease after the signal"
        assert client.zcard(q.keys.active) == 0, "no lease after the signal"
        for pid in map(int, pids.read_text().split()):
            wait_for(lambda pid=pid: not pid_alive(pid), timeout=5, what=f"handler {pid} to be gone")
    drained = daemon.wait_for_log("drained")
    assert "15 returned to pending" in drained["msg"]


def test_jobs_waiting_for_their_type_limit_at_a_drain_are_given_back_not_run(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Leased jobs queued behind a type's concurrency limit must not start after SIGTERM; they go back to
    pending with their attempt returned, even when the slot frees up well within shutdown_timeout."""
    pids = tmp_path / "pids"
    handler = {"command": [sys.executable, sleeper(tmp_path, pids)], "concurrency": 1}
    config = write_config(tmp_path, redis_server.url, namespace, {"work": handler},
                          concurrency=5, shutdown_timeout="20s")  # fmt: skip
    daemon = DaemonProcess(config).start()
    with redis_server.client() as client:
        q = QueueDriver(client, namespace)
        first = q.enqueue("work", {"sleep": 1}).id
        waiting = [q.enqueue("work", {"sleep": 0}).id for _ in range(2)]
        wait_for(lambda: client.zcard(q.keys.active) == 3, what="3 jobs leased")
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 1, what="the first handler to start")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
        assert q.job(first) is None, "the running job finishes within shutdown_timeout"
        assert len(pids.read_text().split()) == 1, "no handler starts after the signal"
        for job_id in waiting:
            job = q.job(job_id)
            assert job is not None
            assert q.where(job_id) is State.PENDING, q.where(job_id)
            assert job.attempt == 0, "the attempt that never ran is given back"
    drained = daemon.wait_for_log("drained")
    assert "2 returned to pending" in drained["msg"]


def test_a_lease_waiting_behind_the_idle_wait_at_a_drain_gives_its_job_back(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """An idle one-queue daemon keeps a lease queued behind its BLMOVE (ADR 0005). A job enqueued just
    before SIGTERM is leased by it while the reply is on the wire: the draining daemon must take that
    reply and give the job back, not drop the connection and leave the job leased until it expires."""
    with handler_server() as handlers, FaultProxy("127.0.0.1", redis_server.port) as proxy:
        url = handlers.url("/jobs/t", lambda req: (200, {}, b""))
        config = write_config(tmp_path, proxy.url_for_redis(), namespace, {"t": {"url": url}}, lease="30s")
        daemon = DaemonProcess(config).start()
        with redis_server.client() as client:
            q = QueueDriver(client, namespace)
            wait_for(lambda: any(c.get("cmd") == "blmove" for c in client.client_list()), what="an idle wait")
            proxy.latency = 0.5  # the lease's reply (and every later byte) reaches the daemon 0.5 s late
            job = q.enqueue("t", {}).id
            wait_for(lambda: q.where(job) is State.ACTIVE, what="the lease behind the wait to take the job")
            daemon.signal(signal.SIGTERM)
            assert daemon.wait(timeout=30) == 0
            assert q.where(job) is State.PENDING, "given back at once, not left leased for 30 s"
            leased = q.job(job)
            assert leased is not None
            assert leased.attempt == 0, "the attempt that never ran is given back"
            assert handlers.requests_to("/jobs/t") == [], "no handler starts after the signal"
        assert "1 returned to pending" in daemon.wait_for_log("drained")["msg"]


def test_a_lease_behind_the_idle_wait_takes_no_more_jobs_than_free_slots(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Jobs arriving one by one at a daemon whose slots are partly busy: each lease sent behind the idle
    wait asks for the free slots only, so the daemon's concurrency holds."""
    running = {"now": 0, "most": 0}
    lock = threading.Lock()  # the handler server answers each request on its own thread
    release = threading.Event()

    def slow(req: Received) -> tuple[int, dict[str, str], bytes]:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        release.wait(30)
        with lock:
            running["now"] -= 1
        return 200, {}, b""

    with handler_server() as handlers:
        url = handlers.url("/jobs/slow", slow)
        config = write_config(tmp_path, redis_server.url, namespace, {"t": {"url": url}}, concurrency=3)
        daemon = DaemonProcess(config).start()
        try:
            with redis_server.client() as client:
                q = QueueDriver(client, namespace)
                ids = []
                for n in range(6):
                    ids.append(q.enqueue("t", n).id)
                    # One at a time while the daemon has free slots, so each is leased behind an idle wait.
                    wait_for(lambda n=n: len(handlers.requests_to("/jobs/slow")) == min(n + 1, 3) and
                             client.llen(q.keys.pending) == max(0, n - 2), what=f"job {n} to be placed")  # fmt: skip
                assert running["most"] == 3
                assert client.zcard(q.keys.active) == 3
                release.set()
                for job_id in ids:
                    wait_for(lambda job_id=job_id: q.job(job_id) is None, what="every job to finish")
                assert running["most"] == 3
        finally:
            release.set()
            daemon.stop()


def test_a_second_signal_gives_everything_back_at_once(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    handler = {"command": [sys.executable, sleeper(tmp_path, pids)], "kill_grace": "1s"}
    config = write_config(tmp_path, redis_server.url, namespace, {"work": handler}, shutdown_timeout="60s")
    daemon = DaemonProcess(config).start()
    with redis_server.client() as client:
        q = QueueDriver(client, namespace)
        ids = [q.enqueue("work", {"sleep": 60}).id for _ in range(3)]
        wait_for(lambda: client.zcard(q.keys.active) == 3, what="3 jobs in flight")
        daemon.signal(signal.SIGTERM)
        daemon.wait_for_log("shutdown requested")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=15) == 0, "well before the 60 s shutdown_timeout"
        assert all(q.where(i) is State.PENDING for i in ids)


def test_sighup_reloads_handlers_and_keeps_the_old_config_when_the_new_one_is_bad(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    with handler_server() as handlers:
        first = handlers.url("/first", lambda req: (200, {}, b""))
        second = handlers.url("/second", lambda req: (200, {}, b""))
        config = write_config(tmp_path, redis_server.url, namespace, {"t": {"url": first}})
        daemon = DaemonProcess(config).start()
        try:
            with redis_server.client() as client:
                q = QueueDriver(client, namespace)
                original = config.read_text()
                config.write_text("handlers: {t: {url: [not, a, url]}}\nbogus: 1\n")
                daemon.signal(signal.SIGHUP)
                failed = daemon.wait_for_log("reload failed")
                assert "bogus" in failed["msg"]
                job = q.enqueue("t", {}).id
                wait_for(lambda: q.job(job) is None, what="the old handler to still run the job")
                assert len(handlers.requests_to("/first")) == 1
                config.write_text(original.replace(first, second))
                daemon.signal(signal.SIGHUP)
                daemon.wait_for_log("reloaded")
                q.enqueue("t", {})
                wait_for(lambda: len(handlers.requests_to("/second")) == 1, what="the new handler to run")
        finally:
            daemon.stop()


def test_redis_going_away_never_kills_the_daemon(server_binary: str, namespace: str, tmp_path: Path) -> None:
    server = RedisServer(server_binary, tmp_path / "redis", extra_args=("--appendonly", "yes")).start()
    with handler_server() as handlers:
        url = handlers.url("/ok", lambda req: (200, {}, b""))
        daemon = DaemonProcess(write_config(tmp_path, server.url, namespace, {"t": {"url": url}})).start()
        try:
            server.stop()
            daemon.wait_for_log("redis unreachable")
            server.start()
            daemon.wait_for_log("redis reachable again", timeout=30)
            with server.client() as client:
                q = QueueDriver(client, namespace)
                job = q.enqueue("t", {}).id
                wait_for(lambda: q.job(job) is None, timeout=20, what="the job to run after the outage")
            assert daemon.process is not None
            assert daemon.process.poll() is None
            unreachable = [line for line in daemon.lines() if "redis unreachable" in line.get("msg", "")]
            assert len(unreachable) == 1, "one log line per state change, not one per retry"
        finally:
            daemon.stop()
            server.stop()


def test_startup_warns_about_settings_that_lose_jobs_and_strict_refuses(
    server_binary: str, namespace: str, tmp_path: Path
) -> None:
    server = RedisServer(server_binary, tmp_path / "redis", extra_args=("--maxmemory-policy", "allkeys-lru")).start()
    try:
        config = write_config(tmp_path, server.url, namespace, {})
        daemon = DaemonProcess(config).start()
        warnings = [line["msg"] for line in daemon.lines() if "REDIS CAN LOSE JOBS" in line.get("msg", "")]
        assert any("allkeys-lru" in w for w in warnings)
        assert any("appendonly" in w for w in warnings)
        daemon.stop()
        strict = json.loads(config.read_text())
        strict["redis"]["strict"] = True
        config.write_text(json.dumps(strict))
        refused = DaemonProcess(config).start(wait_ready=False)
        assert refused.wait(timeout=30) == 78
        assert any("refusing to start" in line.get("msg", "") for line in refused.lines())
    finally:
        server.stop()


@pytest.mark.timeout(180)
def test_a_2_gib_stdout_flood_keeps_daemon_memory_bounded(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    flood = {"command": ["head", "-c", str(2 * 1024**3), "/dev/zero"], "timeout": "120s"}
    config = write_config(tmp_path, redis_server.url, namespace, {"flood": flood}, result_ttl="1h")
    daemon = DaemonProcess(config).start()
    try:
        with redis_server.client() as client:
            q = QueueDriver(client, namespace)
            before = _peak_rss_kib(daemon.pid)
            job = q.enqueue("flood", None).id
            wait_for(lambda: (j := q.job(job)) is not None and j.state is State.DONE, timeout=150,
                     what="the flood to be read to the end")  # fmt: skip
            growth_mib = (_peak_rss_kib(daemon.pid) - before) / 1024
            assert growth_mib < 64, f"daemon peak RSS grew {growth_mib:.1f} MiB"
            done = q.job(job)
            assert done is not None
            assert done.result is not None
            assert b"truncated" in done.result
            assert len(done.result) < 128 * 1024
    finally:
        daemon.stop()


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_daemon_waiting_for_redis_at_start_up_stops_on_sigterm(namespace: str, tmp_path: Path) -> None:
    from tests.servers import free_port

    config = write_config(tmp_path, f"redis://127.0.0.1:{free_port()}/0", namespace, {})
    daemon = DaemonProcess(config).start(wait_ready=False)
    daemon.wait_for_log("redis unreachable")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=15) == 0
    assert any("shutdown requested while starting" in line.get("msg", "") for line in daemon.lines())
