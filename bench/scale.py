"""Does a deep backlog slow jobcar down? Throughput over the same number of jobs taken from the head of
a 10,000-job backlog and of a 1,000,000-job backlog (no-op nginx handler), in one run.

    .venv/bin/python bench/scale.py [--deep 1000000] [--shallow 10000] [--measured 10000] [--runs 3]

Lease pops from the head of a list and ack deletes one hash and one sorted-set entry, so neither
should grow with the backlog; this measures that it does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, wait_for

from jobcar import Client, store
from nginx import Nginx

PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


def throughput_with_backlog(
    server: RedisServer, tmp: Path, url: str, backlog: int, measured: int, runs: int, concurrency: int = 50
) -> list[float]:
    """jobs/s over `measured` jobs per run, each run starting with at least `backlog` pending. The
    backlog is enqueued once, while the queue is paused; each run resumes, times the first `measured`
    completions (pending falls by that many) and pauses again. Runs after the first see a backlog
    shorter by the jobs already taken, topped up to `backlog` first."""
    namespace = f"scale{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench": {"url": url}}, concurrency=concurrency,
                          log_level="info", lease="30s")  # fmt: skip
    keys = store.QueueKeys.of(namespace, "default")
    figures: list[float] = []
    with server.client() as client:
        producer = Client(client, namespace=namespace)
        store.execute(client, [store.pause_call(keys, True)])
        daemon = DaemonProcess(config).start()
        try:
            for _ in range(runs):
                missing = backlog - client.llen(keys.pending)
                for start in range(0, max(0, missing), 5000):
                    producer.enqueue_many([("bench", PAYLOAD)] * min(5000, missing - start))
                target = client.llen(keys.pending) - measured
                started = time.perf_counter()
                store.execute(client, [store.pause_call(keys, False)])
                wait_for(lambda target=target: client.llen(keys.pending) <= target, timeout=600,
                         what="the measured jobs to be leased")  # fmt: skip
                store.execute(client, [store.pause_call(keys, True)])
                # Count completions, not leases: wait for the jobs in hand to be acked.
                wait_for(lambda: client.zcard(keys.active) == 0, timeout=60, what="the jobs in flight to finish")
                figures.append(measured / (time.perf_counter() - started))
        finally:
            daemon.stop()
            for batch in _chunks(list(client.scan_iter(f"{namespace}:*", count=10_000)), 10_000):
                client.unlink(*batch)
    return figures


def _chunks(items: list[bytes], size: int) -> list[list[bytes]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--shallow", type=int, default=10_000)
    parser.add_argument("--measured", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory, Nginx() as url:
        tmp = Path(directory)
        server = RedisServer(find_server_binary(), tmp / "redis").start()
        try:
            shallow = throughput_with_backlog(server, tmp, url, args.shallow, args.measured, args.runs)
            deep = throughput_with_backlog(server, tmp, url, args.deep, args.measured, args.runs)
        finally:
            server.stop()
    s, d = statistics.median(shallow), statistics.median(deep)
    print(f"{args.shallow:,} backlog: {s:,.0f} jobs/s; {args.deep:,} backlog: {d:,.0f} jobs/s; ratio {d / s:.2f}")


if __name__ == "__main__":
    main()
