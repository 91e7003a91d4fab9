"""What jobcar costs besides time: Redis memory per pending job, Redis round trips per job, daemon RSS
with many jobs in flight.

    .venv/bin/python bench/footprint.py

- Bytes per pending job: 100,000 jobs with a 100-byte JSON payload, `used_memory` delta / jobs. Once
  with the server's defaults and once with `hash-max-listpack-value 1024`: a job hash with any value
  longer than that setting (default 64 bytes) is stored as a real hash table instead of a compact
  listpack, which is most of the difference.
- Round trips per job at steady state, from the server's `INFO stats` (`total_reads_processed`: one
  read event per request or pipeline a client sends) and `INFO commandstats` (top-level script calls)
  while a daemon drains a backlog into a no-op handler.
- Daemon RSS (`VmRSS`) with 1,000 HTTP jobs in flight, held by a handler that sleeps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from nginx import Nginx  # bench/nginx.py: this script's directory is on sys.path
from noop_app import serving  # bench/noop_app.py

PAYLOAD_100 = {"data": "x" * 89}  # {"data":"xxx…"} is exactly 100 bytes of JSON


def bytes_per_pending_job(server: RedisServer, jobs: int = 100_000, *, listpack_value: int | None = None) -> float:
    with server.client() as client:
        client.flushall()
        default = client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
        if listpack_value is not None:
            client.config_set("hash-max-listpack-value", listpack_value)
        try:
            producer = Client(client, namespace="mem")
            producer.enqueue("warm", PAYLOAD_100)  # the queue's own keys exist before the measurement
            before = int(client.info("memory")["used_memory"])
            for start in range(0, jobs, 5000):
                producer.enqueue_many([("bench", PAYLOAD_100)] * min(5000, jobs - start))
            return (int(client.info("memory")["used_memory"]) - before) / jobs
        finally:
            client.config_set("hash-max-listpack-value", default)
            client.flushall()


@dataclass(frozen=True)
class RoundTrips:
    reads_per_job: float  # request or pipeline read events the server processed, per job
    scripts_per_job: float  # EVALSHA/EVAL calls per job (each one round trip's worth of work, or part of one)


def round_trips_per_job(
    server: RedisServer, tmp: Path, url: str, jobs: int = 20_000, concurrency: int = 50
) -> RoundTrips:
    """Counted from the server's side while a daemon drains `jobs` into the handler at `url`; the
    measurement's own probes are subtracted."""
    namespace = f"rt{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=concurrency,
                          log_level="info", lease="30s")  # fmt: skip
    keys = QueueKeys.of(namespace, "default")
    with server.client() as client:
        transport.execute(client, [transitions.pause_call(keys, True)])
        producer = Client(client, namespace=namespace)
        for start in range(0, jobs, 5000):
            producer.enqueue_many([("bench", PAYLOAD_100)] * min(5000, jobs - start))
        daemon = DaemonProcess(config).start()
        try:
            probes = 0

            def counters() -> tuple[int, int]:
                nonlocal probes
                probes += 2  # this INFO pair
                stats, commands = client.info("stats"), client.info("commandstats")
                scripts = sum(int(v["calls"]) for k, v in commands.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
                return int(stats["total_reads_processed"]), scripts

            reads_before, scripts_before = counters()
            transport.execute(client, [transitions.pause_call(keys, False)])

            def drained() -> bool:
                nonlocal probes
                probes += 1
                return client.llen(keys.pending) == 0 and client.zcard(keys.active) == 0

            wait_for(drained, timeout=600, what="the backlog to drain")
            reads_after, scripts_after = counters()
        finally:
            daemon.stop()
    # The unpause, the drain probes and the INFO pair are ours; each probe is also one read event.
    ours = probes + 1
    return RoundTrips((reads_after - reads_before - ours) / jobs, (scripts_after - scripts_before - 1) / jobs)


def rss_with_jobs_in_flight(server: RedisServer, tmp: Path, app_url: str, in_flight: int = 1000) -> float:
    """MiB of the daemon's resident memory once `in_flight` HTTP jobs are running at once."""
    namespace = f"rss{time.monotonic_ns()}"
    handler = {"url": f"{app_url.rstrip('/')}/sleep/60", "timeout": "120s"}
    config = write_config(tmp, server.url, namespace, {"hold": handler}, concurrency=in_flight, log_level="info",
                          lease="30s")  # fmt: skip
    keys = QueueKeys.of(namespace, "default")
    daemon = DaemonProcess(config).start()
    try:
        with server.client() as client:
            Client(client, namespace=namespace).enqueue_many([("hold", PAYLOAD_100)] * in_flight)
            wait_for(lambda: client.zcard(keys.active) == in_flight, timeout=120, what="all jobs in flight")
            # Past the lease's first renewal too, so the heartbeat's share is in the figure.
            wait_for(lambda: _renewed(client, keys), timeout=60, what="a renewal")
            return vm_rss_mib(daemon.pid)
    finally:
        daemon.stop()


def _renewed(client: redis.Redis, keys: QueueKeys) -> bool:
    """True once every lease deadline lies more than the first lease away (that is, was extended)."""
    entries = client.zrange(keys.active, 0, 0, withscores=True)
    now_ms = client.time()[0] * 1000
    return bool(entries) and entries[0][1] > now_ms + 25_000


def vm_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="pending jobs for the bytes-per-job figure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, Nginx() as nginx_url, serving() as app:
        tmp = Path(directory)
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        try:
            default = bytes_per_pending_job(server, args.jobs)
            listpack = bytes_per_pending_job(server, args.jobs, listpack_value=1024)
            trips = round_trips_per_job(server, tmp, nginx_url)
            rss = rss_with_jobs_in_flight(server, tmp, app.url)
        finally:
            server.stop()
    print(f"bytes per pending job (100-byte payload): {default:.0f} (server defaults), "
          f"{listpack:.0f} (hash-max-listpack-value 1024)")  # fmt: skip
    print(f"round trips per job: {trips.reads_per_job:.2f} reads, {trips.scripts_per_job:.2f} script calls")
    print(f"daemon RSS with 1,000 jobs in flight: {rss:.1f} MiB")


if __name__ == "__main__":
    main()
