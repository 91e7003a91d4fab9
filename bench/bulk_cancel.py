"""How long does a bulk cancel by filter of 100,000 pending jobs take, and does a daemon keep serving another
queue meanwhile?

    .venv/bin/python bench/bulk_cancel.py [--jobs 100000] [--runs 3]

Each run fills queue `bulk` (which no daemon serves) with --jobs pending jobs of type t.bill, payloads
{"customer": n % 10}, and cancels them with Admin.cancel_matching, the code of `jobcar jobs cancel`, of
POST /v1/jobs/cancel and of the dashboard: first a dry run (--type t.bill: counts them all), then
`--where payload.customer=3` (reads every payload, cancels a tenth), then `--type t.bill` (the rest). Meanwhile
a `jobcar run` (the no-op HTTP app as its handler) serves queue `other`, where a probe (a process of its own)
enqueues one job at a time and waits until it is done, all along: the latency of each probe job (enqueue to
done) before the cancel and during it, and how many ran during it, say whether the daemon kept serving; the
server's SLOWLOG counts the commands (scripts) that took 10 ms or more. The server is flushed between runs.
Prints each step's time and jobs looked at per second, and the probes' latencies (median, p99, max).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.synchronize
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary

import jobcar
from jobcar import Client
from jobcar.admin import Admin
from jobcar.job import State
from jobcar.job_search import JobFilter, parse_condition
from noop_app import serving

CHUNK = 10_000  # jobs per enqueue_many call while filling


def probe(url: str, namespace: str, stop: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:
    """In a process of its own (the bulk cancel's Python work holds no lock it needs): enqueues one job into
    `other` at a time and waits until it is done; puts (when enqueued, latency) of each job, monotonic."""
    producer = Client(redis.Redis.from_url(url), namespace=namespace)
    latencies = []
    while not stop.is_set():
        started = time.monotonic()
        job_id = producer.enqueue("ping", {}, queue="other").id
        while producer.get(job_id, queue="other") is not None:  # done jobs are deleted (no result kept)
            time.sleep(0.001)
        latencies.append((started, time.monotonic() - started))
    out.put(latencies)


def between(latencies: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [latency for at, latency in latencies if start <= at and at + latency <= end]


def fill(client: redis.Redis, namespace: str, jobs: int) -> None:
    producer = Client(client, namespace=namespace)
    for start in range(0, jobs, CHUNK):
        producer.enqueue_many(
            [("t.bill", {"customer": n % 10}, {"queue": "bulk"}) for n in range(start, min(jobs, start + CHUNK))]
        )


async def timed(admin: Admin, job_filter: JobFilter, dry_run: bool) -> tuple[float, int, int, int]:
    """(seconds, jobs examined, matched, canceled) of one bulk cancel of queue bulk's pending jobs."""
    started = time.perf_counter()
    (tally,) = await admin.cancel_matching(["bulk"], [State.PENDING], job_filter, dry_run)
    return time.perf_counter() - started, tally.examined, tally.matched, tally.canceled


def figures(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    median, most = statistics.median(values) * 1000, ordered[-1] * 1000
    return f"{len(values)} jobs, median {median:.1f} ms, p99 {p99 * 1000:.1f} ms, max {most:.1f} ms"


def one_run(server: RedisServer, tmp: Path, url: str, jobs: int) -> None:
    namespace = f"b{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"ping": {"url": url}}, queues={"other": 1}, concurrency=20,
                          log_level="info", lease="30s")  # fmt: skip
    with server.client() as client:
        client.flushdb()
        fill(client, namespace, jobs)
        client.config_set("slowlog-log-slower-than", 10_000)  # µs: every command of 10 ms or more
        client.slowlog_reset()
        daemon = DaemonProcess(config).start()
        stop, out = multiprocessing.Event(), multiprocessing.Queue()
        prober = multiprocessing.Process(target=probe, args=(server.url, namespace, stop, out))
        try:
            prober.start()
            time.sleep(2)  # a baseline of probe jobs before the cancel (not a wait for a condition: a window)
            baseline_end = time.monotonic()

            async def steps() -> list[tuple[str, float, int, int, int]]:
                admin = Admin(redis.asyncio.Redis.from_url(server.url), namespace, ["other"])
                try:
                    every = JobFilter(job_type="t.bill")
                    tenth = JobFilter(where=(parse_condition("payload.customer=3"),))
                    return [
                        ("dry run --type t.bill", *await timed(admin, every, True)),
                        ("--where payload.customer=3", *await timed(admin, tenth, False)),
                        ("--type t.bill (the rest)", *await timed(admin, every, False)),
                    ]
                finally:
                    await admin.redis.aclose()

            during_start = time.monotonic()
            results = asyncio.run(steps())
            during_end = time.monotonic()
            time.sleep(1)  # the probe's last jobs after the cancel
            stop.set()
            latencies = out.get(timeout=30)
            prober.join()
        finally:
            daemon.stop()
        left = client.llen(f"{namespace}:{{bulk}}:pending")
        slow = [entry["duration"] / 1000 for entry in client.slowlog_get(1000)]
        client.flushdb()
    for name, seconds, examined, matched, canceled in results:
        print(f"  {name:<28} {seconds:7.2f} s  examined {examined:>7,} ({examined / seconds:,.0f}/s)  "
              f"matched {matched:>7,}  canceled {canceled:>7,}")  # fmt: skip
    print(f"  total {during_end - during_start:.2f} s; pending left in bulk: {left}")
    print(f"  queue other before: {figures(between(latencies, 0, baseline_end))}")
    print(f"  queue other during: {figures(between(latencies, during_start, during_end))}")
    longest = f", the longest {max(slow):.1f} ms" if slow else ""
    print(f"  Redis commands of 10 ms or more (SLOWLOG, the whole run): {len(slow)}{longest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    binary = find_server_binary()
    with tempfile.TemporaryDirectory() as directory, serving() as app:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            with server.client() as c:
                version = c.info("server").get("redis_version")
            print(f"jobcar {jobcar.__version__}, server {binary} {version}, Python {platform.python_version()}, "
                  f"{args.jobs:,} pending jobs per run")  # fmt: skip
            for run in range(args.runs):
                print(f"run {run + 1}:", flush=True)
                one_run(server, tmp, f"{app.url}/noop", args.jobs)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
