"""Cancel reaches a running job on whichever daemon runs it, and really stops its handler."""

from __future__ import annotations

import threading
from pathlib import Path

from jobcar import State, transitions
from tests.factories import python_handler
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_daemon_lifecycle import pid_alive
from tests.servers import RedisServer, wait_for


def test_cancel_stops_a_running_command_and_its_process_group(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    forever = python_handler(
        tmp_path,
        "forever.py",
        "import subprocess, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(600)\n",
    )
    handler = {"command": forever, "kill_grace": "1s", "timeout": "10m"}
    config = write_config(tmp_path, redis_server.url, namespace, {"long": handler}, result_ttl="1h")
    daemon = DaemonProcess(config).start()
    try:
        with redis_server.client() as client:
            q = QueueDriver(client, namespace)
            job_id = q.enqueue("long", None).id
            wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, what="the handler and its child")
            result = transitions.parse_cancel(q.run(transitions.cancel_call(q.keys, job_id)))
            assert result == (transitions.CancelResult.CANCEL_REQUESTED, State.ACTIVE)
            wait_for(lambda: (j := q.job(job_id)) is not None and j.state is State.CANCELED, timeout=15,
                     what="the daemon to stop the job at its next heartbeat")  # fmt: skip
            for pid in map(int, pids.read_text().split()):
                wait_for(lambda pid=pid: not pid_alive(pid), timeout=5, what=f"process {pid} to be gone")
            job = q.job(job_id)
            assert job is not None
            assert job.attempt == 1, "canceled, not retried"
            assert client.zcard(q.keys.active) == 0
            assert client.llen(q.keys.pending) == 0
    finally:
        daemon.stop()


def test_cancel_aborts_a_running_http_request(redis_server: RedisServer, namespace: str, tmp_path: Path) -> None:
    released = threading.Event()

    def hang(req: Received) -> tuple[int, dict[str, str], bytes]:
        # Answers only when the test releases it; a client that went away is noticed on release.
        released.wait(60)
        return 200, {}, b""

    with handler_server() as handlers:
        url = handlers.url("/jobs/hang", hang)
        config = write_config(tmp_path, redis_server.url, namespace, {"hang": {"url": url, "timeout": "5m"}},
                              result_ttl="1h")  # fmt: skip
        daemon = DaemonProcess(config).start()
        try:
            with redis_server.client() as client:
                q = QueueDriver(client, namespace)
                job_id = q.enqueue("hang", {}).id
                wait_for(lambda: len(handlers.requests_to("/jobs/hang")) == 1, what="the request to arrive")
                q.run(transitions.cancel_call(q.keys, job_id))
                wait_for(lambda: (j := q.job(job_id)) is not None and j.state is State.CANCELED, timeout=15,
                         what="the daemon to abort the request")  # fmt: skip
                canceled = daemon.wait_for_log("job stopped")
                assert canceled["job_id"] == job_id
                assert len(handlers.requests_to("/jobs/hang")) == 1, "not retried"
        finally:
            released.set()
            daemon.stop()
