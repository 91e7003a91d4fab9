"""Does a deep backlog slow jobcar down? Throughput over the same number of jobs taken from the head of
a 10,000-job backlog and of a 1,000,000-job backlog (no-op nginx handler), in one run.

    .venv/bin/python bench/scale.py [--deep 1000000] [--shallow 10000] [--measured 10000] [--rounds 7]

Lease pops from the head of a list and ack deletes one hash and one sorted-set entry, so neither
should grow with the backlog; this measures that it does not. Both backlogs live side by side, each
with its own daemon, and the timed runs alternate between them (shallow, deep, shallow, deep...): a
noisy machine's drift then hits both alike instead of whichever was measured second.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from nginx import Nginx

PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


@dataclass(frozen=True)
class PausedQueue:
    """A queue of its own namespace, paused between timed runs, with a daemon that serves only it."""

    keys: QueueKeys
    producer: Client


@contextlib.contextmanager
def paused_queue(
    server: RedisServer, tmp: Path, url: str, client: redis.Redis, concurrency: int
) -> Iterator[PausedQueue]:
    namespace = f"scale{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=concurrency,
                          log_level="info", lease="30s")  # fmt: skip
    keys = QueueKeys.of(namespace, "default")
    transport.execute(client, [transitions.pause_call(keys, True)])
    daemon = DaemonProcess(config).start()
    try:
        yield PausedQueue(keys, Client(client, namespace=namespace))
    finally:
        daemon.stop()
        for batch in _chunks(list(client.scan_iter(f"{namespace}:*", count=10_000)), 10_000):
            client.unlink(*batch)


def timed_run(client: redis.Redis, queue: PausedQueue, backlog: int, measured: int) -> float:
    """Top the queue up to `backlog` pending jobs, resume it, and return jobs/s over the first `measured`
    completions (pending falls by that many; then pause and wait for the jobs in hand to be acked)."""
    keys = queue.keys
    missing = backlog - client.llen(keys.pending)
    for start in range(0, max(0, missing), 5000):
        queue.producer.enqueue_many([("bench", PAYLOAD)] * min(5000, missing - start))
    target = client.llen(keys.pending) - measured
    started = time.perf_counter()
    transport.execute(client, [transitions.pause_call(keys, False)])
    wait_for(lambda: client.llen(keys.pending) <= target, timeout=600, what="the measured jobs to be leased")
    transport.execute(client, [transitions.pause_call(keys, True)])
    wait_for(lambda: client.zcard(keys.active) == 0, timeout=60, what="the jobs in flight to finish")
    return measured / (time.perf_counter() - started)


def throughput_by_backlog(
    server: RedisServer, tmp: Path, url: str, backlogs: Mapping[str, int], measured: int, rounds: int,
    concurrency: int = 50,
) -> dict[str, list[float]]:  # fmt: skip
    """{name: jobs/s of each round} for each named backlog size; every round times each backlog once, in
    the order given. Each backlog is enqueued once (the deep one takes a while) and topped up per run."""
    figures: dict[str, list[float]] = {name: [] for name in backlogs}
    with server.client() as client, contextlib.ExitStack() as stack:
        queues = {name: stack.enter_context(paused_queue(server, tmp, url, client, concurrency)) for name in backlogs}
        for _ in range(rounds):
            for name, backlog in backlogs.items():
                figures[name].append(timed_run(client, queues[name], backlog, measured))
    return figures


def _chunks(items: list[bytes], size: int) -> list[list[bytes]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--shallow", type=int, default=10_000)
    parser.add_argument("--measured", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, Nginx() as url:
        tmp = Path(directory)
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        try:
            backlogs = {"shallow": args.shallow, "deep": args.deep}
            figures = throughput_by_backlog(server, tmp, url, backlogs, args.measured, args.rounds)
        finally:
            server.stop()
    s, d = statistics.median(figures["shallow"]), statistics.median(figures["deep"])
    print(f"{args.shallow:,} backlog: {s:,.0f} jobs/s; {args.deep:,} backlog: {d:,.0f} jobs/s; ratio {d / s:.2f} "
          f"(medians of {args.rounds} alternating rounds)")  # fmt: skip
    for name, values in figures.items():
        print(f"  {name}: {' '.join(f'{v:,.0f}' for v in values)}")


if __name__ == "__main__":
    main()
