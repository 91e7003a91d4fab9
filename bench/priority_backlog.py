"""Does the lease's cost grow with the backlog when priorities are in use? A daemon's jobs/s over the same
number of jobs on top of a small and a large backlog.

    .venv/bin/python bench/priority_backlog.py [--jobs 5000] [--backlogs 10000,1000000] [--runs 3]

Each round fills a paused queue with a backlog: --jobs measured jobs, half of priority 3 and half of
priority 6, then filler jobs of priority 9 up to the backlog's size (so the measured jobs cross two
priorities' lists and the filler waits in a third). A `jobcar run` (concurrency 50, the no-op HTTP app as
its handler) is started, the queue resumed, and the time until the measured jobs have all been leased
is taken: the filler is leased only after them. The reference row does the same with every job of
priority 0, the path of a queue that never names a priority. Rounds alternate between the backlogs;
the server is flushed between rounds. Prints the median jobs/s of each and the ratio large/small.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

import jobcar
from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from noop_app import serving

PAYLOAD = {"user": 1234567, "template": "welcome"}
CHUNK = 50_000  # jobs per enqueue_many call while filling


def fill(client: redis.Redis, namespace: str, measured: int, backlog: int, priorities: bool) -> None:
    producer = Client(client, namespace=namespace)
    first = [3, 6] if priorities else [0, 0]
    specs = [("bench", PAYLOAD, {"priority": first[n % 2]}) for n in range(measured)]
    producer.enqueue_many(specs)
    filler = {"priority": 9 if priorities else 0}
    for start in range(measured, backlog, CHUNK):
        producer.enqueue_many([("bench", PAYLOAD, filler)] * min(CHUNK, backlog - start))


def pending(client: redis.Redis, keys: QueueKeys) -> int:
    stats = transport.execute(client, [transitions.stats_call(keys)])[0]
    return transitions.parse_stats(keys, stats).pending


def round_jobs_per_second(server: RedisServer, tmp: Path, url: str, measured: int, backlog: int,
                          priorities: bool) -> float:  # fmt: skip
    namespace = f"b{time.monotonic_ns()}"
    keys = QueueKeys.of(namespace, "default")
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=50, log_level="info",
                          lease="30s")  # fmt: skip
    with server.client() as client:
        client.flushdb()
        transport.execute(client, [transitions.pause_call(keys, True)])
        fill(client, namespace, measured, backlog, priorities)
        daemon = DaemonProcess(config).start()
        try:
            started = time.perf_counter()
            transport.execute(client, [transitions.pause_call(keys, False)])
            wait_for(lambda: pending(client, keys) <= backlog - measured, timeout=600, what="the measured jobs")
            elapsed = time.perf_counter() - started
        finally:
            daemon.stop()
        client.flushdb()
    return measured / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--backlogs", default="10000,1000000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    small, large = (int(n) for n in args.backlogs.split(","))
    binary = find_server_binary()
    figures: dict[tuple[bool, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as directory, serving() as app:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            url = f"{app.url}/noop"
            for _ in range(args.runs):
                for priorities in (True, False):
                    for backlog in (small, large):
                        rate = round_jobs_per_second(server, tmp, url, args.jobs, backlog, priorities)
                        figures.setdefault((priorities, backlog), []).append(rate)
                        print(f"  priorities={priorities} backlog={backlog:,}: {rate:,.0f} jobs/s", flush=True)
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, Python {platform.python_version()}, "
        f"{args.jobs} measured jobs per round, medians of {args.runs} (min-max)"
    )
    print(f"{'jobs':<24}{'backlog ' + f'{small:,}':>22}{'backlog ' + f'{large:,}':>24}{'ratio':>8}")
    for priorities, name in ((True, "priorities 3 and 6"), (False, "priority 0 only")):
        low, high = figures[(priorities, small)], figures[(priorities, large)]
        cells = [f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})" for v in (low, high)]
        ratio = statistics.median(high) / statistics.median(low)
        print(f"{name:<24}{cells[0]:>22}{cells[1]:>24}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
