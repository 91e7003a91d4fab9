"""What does batched delivery buy? Jobs/s with `batch: {max_size: 100}` beside one call per job.

    .venv/bin/python bench/batching.py [--jobs 20000] [--runs 3] [--size 100]

Each round enqueues --jobs no-op jobs into a paused queue, starts a `jobcar run` (concurrency 200), resumes
the queue and times until every job is done. Handlers: nginx (`return 204;` per job; a batch answered by a
few lines of njs, every job done) and the aiohttp no-op app (204 per job; a batch answered in Python). Rounds
alternate between the four setups; medians of --runs, and the ratio batched / one call per job.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary

import jobcar
from daemon import resume_and_drain  # bench/daemon.py
from jobcar import Client, transitions, transport
from jobcar.keys import QueueKeys
from nginx import Nginx, nginx_version
from noop_app import serving

CONCURRENCY = 200


def throughput(server: RedisServer, tmp: Path, handler: dict[str, Any], jobs: int) -> float:
    namespace = f"b{time.monotonic_ns()}"
    keys = QueueKeys.of(namespace, "default")
    config = write_config(tmp, server.url, namespace, {"bench": handler}, concurrency=CONCURRENCY,
                          log_level="info", lease="30s")  # fmt: skip
    with server.client() as client:
        client.flushdb()
        transport.execute(client, [transitions.pause_call(keys, True)])
        Client(client, namespace=namespace).enqueue_many([("bench", {"n": n}) for n in range(jobs)])
        daemon = DaemonProcess(config).start()
        try:
            elapsed = resume_and_drain(client, keys)
            dead = client.zcard(keys.dead)
        finally:
            daemon.stop()
        client.flushdb()
    if dead:
        raise RuntimeError(f"{dead} jobs went to the dead-letter queue: the handler did not answer for them")
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="batch.max_size")
    args = parser.parse_args()
    binary = find_server_binary()
    batch = {"max_size": args.size, "max_wait": "200ms"}
    shapes = ("one call per job", f"batches of {args.size}")
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as directory, serving() as app, Nginx(batches=True) as nginx_url:
        tmp = Path(directory)
        # Each handler's base URL: /noop answers one job, /batch a batch (every job done).
        bases = {"nginx": nginx_url.removesuffix("/noop"), "aiohttp": app.url}
        server = RedisServer(binary, tmp / "redis").start()
        try:
            for _ in range(args.runs):
                for handler_name, base in bases.items():
                    handlers = ({"url": f"{base}/noop"}, {"url": f"{base}/batch", "batch": batch})
                    for shape, handler in zip(shapes, handlers, strict=True):
                        rate = throughput(server, tmp, handler, args.jobs)
                        figures.setdefault((handler_name, shape), []).append(rate)
                        print(f"  {handler_name}, {shape}: {rate:,.0f} jobs/s", flush=True)
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, nginx {nginx_version()}, "
        f"Python {platform.python_version()}, concurrency {CONCURRENCY}, {args.jobs} jobs per round, "
        f"medians of {args.runs} (min-max)"
    )
    for (handler_name, shape), v in figures.items():
        label = f"{handler_name}, {shape}"
        print(f"{label:<30}{statistics.median(v):>10,.0f} jobs/s ({min(v):,.0f}-{max(v):,.0f})")
    for handler_name in bases:
        single, batched = (statistics.median(figures[(handler_name, shape)]) for shape in shapes)
        print(f"{'ratio ' + handler_name:<30}{batched / single:>10.2f}x")


if __name__ == "__main__":
    main()
