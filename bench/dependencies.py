"""What do dependencies cost: a fan-in beside independent jobs, and how soon a waiting job runs?

    .venv/bin/python bench/dependencies.py [--jobs 10000] [--runs 3] [--chains 500]

Throughput: each round enqueues --jobs jobs into a paused queue, starts a `jobcar run` (concurrency 50,
the no-op HTTP app as its handler), resumes the queue and times until every job is done. Once as
independent jobs; once with one more job waiting for all of them (`after`: a fan-in, enqueued in the same
call), in their queue (each ack tells it in place) and in another queue (each ack leaves an entry for the
settler); once as a batch sealed with an `on_complete` callback (the other way to fan in). All but the
first are timed until the fan-in too is done. Rounds alternate; medians of --runs.

Latency: --chains chains of two jobs (the second `after` the first, in the same queue, then in another),
one chain at a time, through a daemon whose in-process handler answers at once and records when each job
reached it: the second step's arrival minus the first's, which holds the first's answer, its ack (and
the settler telling the second, for another queue), its lease and its request.
"""

from __future__ import annotations

import argparse
import asyncio
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
from daemon import percentile, recording_daemon, resume_and_drain  # bench/daemon.py
from jobcar import AsyncClient, Client, transitions, transport
from jobcar.keys import QueueKeys
from noop_app import serving

#: The rounds: independent jobs; the same with one job `after` all of them, in their queue (released by the
#: acks themselves) or in another (through the settler); the same as a batch whose `on_complete` callback
#: is the fan-in.
SHAPES = ("independent", "after", "after-other", "batch")
QUEUES = {"default": 1, "other": 1}


def throughput(server: RedisServer, tmp: Path, url: str, jobs: int, shape: str) -> float:
    namespace = f"d{time.monotonic_ns()}"
    keys = QueueKeys.of(namespace, "default")
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=50, log_level="info",
                          lease="30s", queues=QUEUES)  # fmt: skip
    with server.client() as client:
        client.flushdb()
        transport.execute(client, [transitions.pause_call(keys, True)])
        producer = Client(client, namespace=namespace)
        batch = {"batch": "all"} if shape == "batch" else {}
        specs = [("bench", {"n": n}, {"job_id": f"j{n}", **batch}) for n in range(jobs)]
        if shape.startswith("after"):
            queue = "other" if shape == "after-other" else "default"
            specs.append(("bench", None, {"job_id": "fan-in", "queue": queue, "after": [f"j{n}" for n in range(jobs)]}))
        producer.enqueue_many(specs)
        if shape == "batch":
            producer.seal_batch("all", on_complete=("bench", None))
        daemon = DaemonProcess(config).start()
        try:
            started = time.perf_counter()
            resume_and_drain(client, keys)  # the parts; then the fan-in
            everywhere = [QueueKeys.of(namespace, queue) for queue in QUEUES]
            wait_for(lambda: sum(_unfinished(client, k) for k in everywhere) == 0, timeout=120, what="the fan-in")
            elapsed = time.perf_counter() - started
        finally:
            daemon.stop()
        client.flushdb()
    return (jobs + (shape != "independent")) / elapsed


async def release_latency(server: RedisServer, tmp: Path, chains: int, second_queue: str) -> list[float]:
    """Milliseconds from each chain's first step reaching its handler (which answers at once) to its second
    step reaching it, in `second_queue`: the ack (and the settler's telling, for another queue), the lease
    and the request, end to end."""
    async with (
        recording_daemon(server, tmp, queues=QUEUES) as (namespace, arrivals),
        AsyncClient.from_url(server.url, namespace=namespace) as client,
    ):
        await client.enqueue("lat", None)  # warm the connections
        await asyncio.sleep(0.5)
        gaps = []
        # One chain at a time: the daemon is idle when a second step becomes pending, so the figure is the
        # release's own, not a wait behind other jobs.
        for n in range(chains):
            first, second = await client.chain([("lat", n), ("lat", n, {"queue": second_queue})])
            deadline = time.monotonic() + 10
            while second.id not in arrivals and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            gaps.append((arrivals[second.id] - arrivals[first.id]) * 1000)
    return gaps


def _unfinished(client: redis.Redis, keys: QueueKeys) -> int:
    stats = transitions.parse_stats(keys, transport.execute(client, [transitions.stats_call(keys)])[0])
    return stats.pending + stats.active + stats.scheduled + stats.waiting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chains", type=int, default=500)
    args = parser.parse_args()
    binary = find_server_binary()
    figures: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    with tempfile.TemporaryDirectory() as directory, serving() as app:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            url = f"{app.url}/noop"
            for _ in range(args.runs):
                for name in figures:
                    rate = throughput(server, tmp, url, args.jobs, name)
                    figures[name].append(rate)
                    print(f"  {name}: {rate:,.0f} jobs/s", flush=True)
            latencies = {queue: asyncio.run(release_latency(server, tmp, args.chains, queue)) for queue in QUEUES}
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, Python {platform.python_version()}, "
        f"{args.jobs} jobs per round, concurrency 50, medians of {args.runs} (min-max)"
    )
    labels = {
        "independent": f"{args.jobs} independent jobs",
        "after": "+ one job after all, same queue",
        "after-other": "+ one job after all, other queue",
        "batch": "as a batch + its on_complete",
    }
    base = statistics.median(figures["independent"])
    for name, label in labels.items():
        v = figures[name]
        ratio = "" if name == "independent" else f"  {statistics.median(v) / base:.2f}x"
        print(f"{label:<34}{statistics.median(v):>10,.0f} jobs/s ({min(v):,.0f}-{max(v):,.0f}){ratio}")
    for queue, gaps in latencies.items():
        where = "in its queue" if queue == "default" else "in another queue"
        figures_ms = f"p50 {percentile(gaps, 0.5):.1f} ms, p99 {percentile(gaps, 0.99):.1f} ms, max {max(gaps):.1f} ms"
        print(f"chain step -> next step at the handler, {where} ({args.chains} chains, one at a time): {figures_ms}")


if __name__ == "__main__":
    main()
