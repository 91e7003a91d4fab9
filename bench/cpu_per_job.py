"""CPU per job of each process while one daemon drains a backlog: where a throughput figure's cores go.

    .venv/bin/python bench/cpu_per_job.py [--jobs 100000] [--runs 2]

For each handler, the nginx no-op (`return 204`) and the minimal aiohttp app of `make bench`: a backlog
enqueued while the queue is paused, one `jobcar run` (concurrency 50) draining it, and the user + system
CPU that the daemon, Redis and (for the aiohttp app) the handler spent from resume to the last ack, read
from /proc and divided by the jobs. Runs alternate between the handlers. On two cores the sum over the
processes bounds throughput: three processes needing T µs of CPU a job cannot pass 2e6 / T jobs/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary

from daemon import PAYLOAD, resume_and_drain  # bench/daemon.py
from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from nginx import Nginx  # bench/nginx.py
from noop_app import serving  # bench/noop_app.py

_TICKS: int = os.sysconf("SC_CLK_TCK")
_ENQUEUE_CHUNK = 10_000


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/PID/stat, after the parenthesised name)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def measured_drain(
    client: redis.Redis, keys: QueueKeys, pids: dict[str, int], jobs: int
) -> tuple[float, dict[str, float]]:
    """Resume the paused queue and wait until it drained (bench/daemon.py): the seconds, and µs of CPU per job
    each process of `pids` spent meanwhile."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    elapsed = resume_and_drain(client, keys)
    return elapsed, {name: (cpu_seconds(pid) - before[name]) / jobs * 1e6 for name, pid in pids.items()}


def drain(server: RedisServer, tmp: Path, url: str, jobs: int, handler_pid: int | None) -> dict[str, float]:
    """µs of CPU per job by process, and jobs/s, for one daemon draining `jobs` jobs posted to `url`."""
    namespace = f"cpu{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=50, log_level="info",
                          lease="30s")  # fmt: skip
    keys = QueueKeys.of(namespace, "default")
    assert server.process is not None
    with server.client() as client:
        transport.execute(client, [transitions.pause_call(keys, True)])
        producer = Client(client, namespace=namespace)
        for start in range(0, jobs, _ENQUEUE_CHUNK):
            producer.enqueue_many([("bench", PAYLOAD)] * min(_ENQUEUE_CHUNK, jobs - start))
        daemon = DaemonProcess(config).start()
        try:
            pids = {"daemon": daemon.pid, "redis": server.process.pid}
            if handler_pid is not None:
                pids["handler"] = handler_pid
            elapsed, used = measured_drain(client, keys, pids, jobs)
        finally:
            daemon.stop()
    return {"jobs/s": jobs / elapsed, **used}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, ExitStack() as stack:
        tmp = Path(directory)
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        stack.callback(server.stop)
        nginx_url = stack.enter_context(Nginx())
        app = stack.enter_context(serving())
        app_url = f"{app.url}/noop"
        for run in range(1, args.runs + 1):
            for name, url, handler_pid in (("nginx", nginx_url, None), ("aiohttp app", app_url, app.pid)):
                figures = drain(server, tmp, url, args.jobs, handler_pid)
                line = "; ".join(f"{k} {v:.1f} µs" for k, v in figures.items() if k != "jobs/s")
                print(f"run {run}, {name}: {figures['jobs/s']:,.0f} jobs/s; CPU per job: {line}", flush=True)


if __name__ == "__main__":
    main()
