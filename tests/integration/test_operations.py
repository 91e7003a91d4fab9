"""The operator's view of a real `jobcar run`: metrics that move as jobs flow, and systemd notifications
across a real SIGTERM."""

from __future__ import annotations

import json
import platform
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from jobcar import State
from tests.factories import python_handler
from tests.integration.daemon_harness import (
    DaemonProcess,
    Received,
    handler_server,
    listen_url,
    scrape,
    value,
    write_config,
)
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for


def test_metrics_move_as_jobs_flow(redis_server: RedisServer, namespace: str, tmp_path: Path) -> None:
    def answer(req: Received) -> tuple[int, dict[str, str], bytes]:
        return (200, {}, b"") if b'"ok"' in req.body else (422, {}, b"no")

    with handler_server() as handlers:
        url = handlers.url("/jobs/m", answer)
        config = write_config(tmp_path, redis_server.url, namespace, {"m": {"url": url}})
        daemon = DaemonProcess(config).start()
        try:
            base = listen_url(daemon)
            before = scrape(base)
            assert value(before, "jobcar_jobs_finished_total", queue="default", type="m", outcome="done") == 0
            assert value(before, "jobcar_jobs_finished_total", queue="default", type="other", outcome="dead") == 0
            assert value(before, "jobcar_build_info", version="0.1.0", python=platform.python_version()) == 1
            with redis_server.client() as client:
                q = QueueDriver(client, namespace)
                ok = [q.enqueue("m", "ok").id for _ in range(3)]
                bad = q.enqueue("m", "bad").id
                unknown = q.enqueue("nobody", {}).id
                for job_id in ok:
                    wait_for(lambda job_id=job_id: q.job(job_id) is None, what="ok jobs to finish")
                for job_id in (bad, unknown):
                    wait_for(lambda job_id=job_id: q.where(job_id) is State.DEAD, what="failures in the DLQ")
                q.enqueue("m", "ok", delay=3600)

            def recorded() -> bool:
                # The daemon counts an outcome once Redis has acknowledged it: just after the test sees it.
                now = scrape(base)
                finished = [value(now, "jobcar_jobs_finished_total", queue="default", type=t, outcome=o)
                            for t, o in (("m", "done"), ("m", "dead"), ("other", "dead"))]  # fmt: skip
                return finished == [3, 1, 1]

            wait_for(recorded, what="every outcome to be counted")
            after = scrape(base)
            assert value(after, "jobcar_jobs_leased_total", queue="default") == 5
            assert value(after, "jobcar_jobs_finished_total", queue="default", type="m", outcome="done") == 3
            assert value(after, "jobcar_jobs_finished_total", queue="default", type="m", outcome="dead") == 1
            assert value(after, "jobcar_jobs_finished_total", queue="default", type="other", outcome="dead") == 1
            assert value(after, "jobcar_job_duration_seconds_count", queue="default", type="m") == 4
            assert value(after, "jobcar_job_wait_seconds_count", queue="default") == 5
            assert value(after, "jobcar_jobs_in_flight", queue="default") == 0
            # Counters and histograms without a `*_created` series each (prometheus_client's default, turned off).
            assert [name for name, _ in after if name.endswith("_created")] == []
            # Queue depths are read from Redis at scrape time, cached for a second.
            wait_for(lambda: value(scrape(base), "jobcar_queue_jobs", queue="default", state="scheduled") == 1,
                     what="the depth gauges to refresh")  # fmt: skip
            depths = scrape(base)
            assert value(depths, "jobcar_queue_jobs", queue="default", state="dead") == 2
            assert value(depths, "jobcar_queue_jobs", queue="default", state="pending") == 0
            assert value(depths, "jobcar_queue_latency_seconds", queue="default") == 0
        finally:
            daemon.stop()


def test_systemd_hears_ready_watchdog_and_stopping_across_a_real_sigterm(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """A datagram socket stands in for systemd's NOTIFY_SOCKET; recv() times out (fails) after 10 s."""
    address = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(10)
    messages: list[str] = []

    def receive_until(done: Callable[[list[str]], bool]) -> None:
        while not done(messages):
            messages.append(sock.recv(4096).decode())

    try:
        config = write_config(tmp_path, redis_server.url, namespace, {})
        daemon = DaemonProcess(config, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"}).start()
        try:
            receive_until(lambda m: any("READY=1" in x for x in m))
            receive_until(lambda m: sum("WATCHDOG=1" in x for x in m) >= 2)
            daemon.signal(signal.SIGTERM)
            receive_until(lambda m: any("STOPPING=1" in x for x in m))
            assert daemon.wait(timeout=20) == 0
        finally:
            daemon.stop()
        ready = next(m for m in messages if "READY=1" in m)
        assert "STATUS=running" in ready
        assert messages.index(ready) < next(i for i, m in enumerate(messages) if "STOPPING=1" in m)
    finally:
        sock.close()


def jobcar(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobcar.cli", "-c", str(config), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_operator_commands_against_a_running_daemon(redis_server: RedisServer, namespace: str, tmp_path: Path) -> None:
    handler = {"command": python_handler(tmp_path, "slow.py", "import time\ntime.sleep(600)"), "kill_grace": "1s",
               "timeout": "10m"}  # fmt: skip
    config = write_config(tmp_path, redis_server.url, namespace, {"slow": handler}, result_ttl="1h")
    daemon = DaemonProcess(config).start()
    try:
        base = listen_url(daemon)
        assert jobcar(config, "health", "--url", base + "/healthz").returncode == 0
        enqueued = jobcar(config, "enqueue", "slow", '{"n": 1}')
        assert enqueued.returncode == 0, enqueued.stderr
        job_id = enqueued.stdout.strip()
        with redis_server.client() as client:
            q = QueueDriver(client, namespace)
            wait_for(lambda: q.where(job_id) is State.ACTIVE, what="the job to run")
            stats = json.loads(jobcar(config, "stats", "--json").stdout)
            assert [(s["queue"], s["active"]) for s in stats] == [("default", 1)]
            shown = json.loads(jobcar(config, "jobs", "show", "--json", "--", job_id).stdout)
            assert shown["state"] == "active"
            assert shown["attempt"] == 1
            canceled = jobcar(config, "cancel", "--", job_id)
            assert canceled.returncode == 0
            assert "cancel" in canceled.stdout
            wait_for(lambda: (j := q.job(job_id)) is not None and j.state is State.CANCELED, timeout=15,
                     what="the daemon to stop the canceled job")  # fmt: skip
        assert "0" in jobcar(config, "stats").stdout
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
        assert jobcar(config, "health", "--url", base + "/healthz").returncode == 1, "nothing listens any more"
    finally:
        daemon.stop()


def test_the_daemon_refuses_an_exposed_listener_without_a_token(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, redis_server.url, namespace, {}, listen="0.0.0.0:0")
    refused = DaemonProcess(config).start(wait_ready=False)
    assert refused.wait(timeout=30) == 78
    assert any("api_token" in line.get("msg", "") for line in refused.lines())
