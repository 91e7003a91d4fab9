"""Enqueue throughput: jobcar's client beside plain redis-py LPUSH of the same payloads, one run.

    .venv/bin/python bench/enqueue.py [--jobs 100000] [--runs 3]

Starts its own server (the test harness's choice of binary), runs each scenario --runs times in
alternation and prints the median jobs/s and the ratio to its limit. The limit is what a bare client
does with the same payloads: LPUSH keeps no per-job state (no hash, no unique check, no schedule), so
it is the ceiling, not a peer.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

import jobcar
from jobcar import Client

CHUNK = 500  # jobcar's enqueue_many chunk: the LPUSH limit pipelines the same number per round trip
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


def bulk_enqueue_many(client: redis.Redis, jobs: int) -> None:
    producer = Client(client, namespace=f"b{uuid.uuid4().hex[:8]}")
    producer.enqueue_many([("email.welcome", PAYLOAD)] * jobs)


def encode(payload: object) -> bytes:
    """What any producer pays per job: the payload as JSON."""
    return json.dumps(payload, separators=(",", ":")).encode()


def bulk_lpush(client: redis.Redis, jobs: int) -> None:
    key = f"b{uuid.uuid4().hex[:8]}:list"
    for start in range(0, jobs, CHUNK):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(CHUNK, jobs - start)):
            pipe.lpush(key, encode(PAYLOAD))
        pipe.execute()


def single_enqueue(client: redis.Redis, jobs: int) -> None:
    producer = Client(client, namespace=f"b{uuid.uuid4().hex[:8]}")
    for _ in range(jobs):
        producer.enqueue("email.welcome", PAYLOAD)


def single_lpush(client: redis.Redis, jobs: int) -> None:
    key = f"b{uuid.uuid4().hex[:8]}:list"
    for _ in range(jobs):
        client.lpush(key, encode(PAYLOAD))


def measure(fn: Callable[[redis.Redis, int], None], client: redis.Redis, jobs: int) -> float:
    client.flushall()
    started = time.perf_counter()
    fn(client, jobs)
    return jobs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per bulk run (single runs use a tenth)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    binary = find_server_binary()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, Path(tmp)).start()
        try:
            with server.client() as client:
                version = client.info("server").get("redis_version")
                pairs = [
                    ("enqueue_many", bulk_enqueue_many, "pipelined LPUSH", bulk_lpush, args.jobs),
                    ("single enqueue", single_enqueue, "single LPUSH", single_lpush, args.jobs // 10),
                ]
                results: dict[str, list[float]] = {}
                for _ in range(args.runs):
                    for name, fn, limit_name, limit_fn, jobs in pairs:
                        results.setdefault(name, []).append(measure(fn, client, jobs))
                        results.setdefault(limit_name, []).append(measure(limit_fn, client, jobs))
        finally:
            server.stop()

    print(f"jobcar {jobcar.__version__}, redis-py {redis.__version__}, server {binary} {version}, "
          f"Python {platform.python_version()}, {args.runs} runs, median jobs/s")  # fmt: skip
    print(f"{'scenario':<16}{'jobs':>9}{'jobcar/s':>12}{'limit':>18}{'limit/s':>12}{'ratio':>8}")
    for name, _fn, limit_name, _limit_fn, jobs in pairs:
        mine, limit = statistics.median(results[name]), statistics.median(results[limit_name])
        print(f"{name:<16}{jobs:>9}{mine:>12,.0f}{limit_name:>18}{limit:>12,.0f}{mine / limit:>8.2f}")


if __name__ == "__main__":
    main()
