"""Enqueue throughput: jobcar's client and HTTP API beside plain redis-py LPUSH of the same payloads.

    .venv/bin/python bench/enqueue.py [--jobs 100000] [--runs 3]

Starts its own server (the test harness's choice of binary), runs each scenario --runs times in
alternation and prints the median jobs/s and the ratio to its limit. The limit is what a bare client
does with the same payloads: LPUSH keeps no per-job state (no hash, no unique check, no schedule), so
it is the ceiling, not a peer.

- enqueue_many (chunks of 500, one round trip each) and HTTP POST /v1/jobs batches of 500
  ({"jobs": [...]}) beside LPUSH pipelined 500 per round trip, over --jobs jobs;
- single `enqueue`, one call at a time, beside one LPUSH round trip at a time, over a tenth of --jobs; and the
  floor for any script that keeps per-job state, one EVALSHA doing only HSET + LPUSH per job;
- HTTP POST /v1/jobs of one job from 1, 8 and 64 concurrent keep-alive clients (HTTP_CLIENTS), over a tenth of
  --jobs, beside the same load on a bare aiohttp server on uvloop that parses each job's JSON and answers 201,
  storing nothing (bench/noop_app.py): the HTTP stack's own limit, which concurrent producers meet before
  Redis's (bench/run.py also sets the one-client figure beside single LPUSH).

The HTTP scenarios post to a real `jobcar run` daemon's listener on loopback, from an aiohttp client on
uvloop (keep-alive connections, each body encoded per request as a producer would). The daemon serves
no handler for the enqueued queue, so it only enqueues; it runs only during a round's scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, free_port

import jobcar
from jobcar import Client
from jobcar.records import new_job_id
from noop_app import serving  # bench/noop_app.py

CHUNK = 500  # jobcar's enqueue_many chunk: the LPUSH limit pipelines the same number per round trip
HTTP_BATCH = 500  # jobs per POST /v1/jobs batch (the API takes at most 1,000)
HTTP_CLIENTS = (1, 8, 64)  # concurrent producers posting one job per request
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}
JOB = {"type": "email.welcome", "payload": PAYLOAD}


def bulk_enqueue_many(client: redis.Redis, jobs: int) -> None:
    producer = Client(client, namespace=f"b{uuid.uuid4().hex[:8]}")
    producer.enqueue_many([("email.welcome", PAYLOAD)] * jobs)


def encode(payload: object) -> bytes:
    """What any producer pays per job (or per request): the payload as JSON."""
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


#: The least a script keeping per-job state can do: store a hash and push its id. jobcar's enqueue also
#: refuses an existing id, reads Redis time and wakes idle daemons; this is the floor under it.
FLOOR_SCRIPT = """
redis.call('HSET', KEYS[2], 'type', ARGV[1], 'payload', ARGV[2], 'state', 'pending', 'created', ARGV[3])
redis.call('LPUSH', KEYS[1], ARGV[4])
return 1
"""


def single_floor_script(client: redis.Redis, jobs: int) -> None:
    prefix = f"b{uuid.uuid4().hex[:8]}:"
    floor = client.register_script(FLOOR_SCRIPT)
    for _ in range(jobs):
        job_id = new_job_id()
        floor(keys=[prefix + "pending", prefix + "job:" + job_id], args=["email.welcome", encode(PAYLOAD), 0, job_id])


async def _post_all(url: str, bodies: Iterator[bytes], clients: int = 1) -> None:
    """Each body POSTed, by `clients` producers at once, each on a keep-alive connection of its own."""
    headers = {"Content-Type": "application/json"}

    async def producer(session: aiohttp.ClientSession) -> None:
        for body in bodies:  # shared: each producer takes the next body when it is free
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"POST {url}: {resp.status} {await resp.text()}")
                await resp.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(producer(session) for _ in range(clients)))


def _on_uvloop(coro: object) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)  # type: ignore[arg-type]


def http_single(url: str, client: redis.Redis, jobs: int, clients: int = 1) -> None:
    """POST /v1/jobs, one job per request, from `clients` producers at once. `client` is unused (measure's
    signature)."""
    _on_uvloop(_post_all(url, (encode(JOB) for _ in range(jobs)), clients))


def http_batch(url: str, client: redis.Redis, jobs: int) -> None:
    """POST /v1/jobs with {"jobs": [...]} of HTTP_BATCH jobs, one request at a time."""
    sizes = (min(HTTP_BATCH, jobs - start) for start in range(0, jobs, HTTP_BATCH))
    _on_uvloop(_post_all(url, (encode({"jobs": [JOB] * n}) for n in sizes)))


def measure(fn: Callable[[redis.Redis, int], None], client: redis.Redis, jobs: int) -> float:
    client.flushall()
    started = time.perf_counter()
    fn(client, jobs)
    return jobs / (time.perf_counter() - started)


@dataclass(frozen=True)
class Pair:
    """A jobcar scenario and its limit, measured one after the other in each round."""

    name: str
    fn: Callable[[redis.Redis, int], None]
    limit_name: str
    limit_fn: Callable[[redis.Redis, int], None]
    jobs: int


def pairs(jobs: int, api_url: str | None, bare_url: str | None = None) -> list[Pair]:
    """Every scenario for `jobs` bulk jobs (single ones use a tenth); the HTTP ones when there is an API URL (and
    the bare server's, or "-" for the names only)."""
    single = max(1, jobs // 10)
    found = [
        Pair("enqueue_many", bulk_enqueue_many, "pipelined LPUSH", bulk_lpush, jobs),
        Pair("single enqueue", single_enqueue, "single LPUSH", single_lpush, single),
        Pair("floor script", single_floor_script, "single LPUSH", single_lpush, single),
    ]
    if api_url is not None:
        found += [
            Pair("HTTP batch", partial(http_batch, api_url), "pipelined LPUSH", bulk_lpush, jobs),
        ]
        bare = bare_url or "-"
        found += [
            Pair(f"HTTP single x{n}", partial(http_single, api_url, clients=n), f"bare aiohttp x{n}",
                 partial(http_single, bare, clients=n), single)
            for n in HTTP_CLIENTS
        ]  # fmt: skip
    return found


@contextlib.contextmanager
def api_daemon(server: RedisServer, tmp: Path) -> Iterator[str]:
    """A `jobcar run` daemon on `server` whose listener takes POST /v1/jobs; yields that URL.

    It consumes only the queue "idle", so what the benchmark enqueues (queue "default") stays pending."""
    port = free_port()
    namespace = f"api{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench.idle": {"url": "http://127.0.0.1:9/"}},
                          log_level="info", lease="30s", listen=f"127.0.0.1:{port}", queues={"idle": 1})  # fmt: skip
    daemon = DaemonProcess(config).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/jobs"
    finally:
        daemon.stop()


def measure_round(server: RedisServer, tmp: Path, jobs: int, *, http: bool = True) -> dict[str, float]:
    """One round of every scenario, each beside its limit: {name: jobs/s}. A limit shared by two scenarios
    is measured once per round, beside the first."""
    figures: dict[str, float] = {}
    with contextlib.ExitStack() as stack, server.client() as client:
        api_url = stack.enter_context(api_daemon(server, tmp)) if http else None
        bare_url = stack.enter_context(serving(on_uvloop=True)).url + "/v1/jobs" if http else None
        for pair in pairs(jobs, api_url, bare_url):
            if pair.limit_name not in figures:
                figures[pair.limit_name] = measure(pair.limit_fn, client, pair.jobs)
            figures[pair.name] = measure(pair.fn, client, pair.jobs)
        client.flushall()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per bulk run (single runs use a tenth)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP /v1/jobs scenarios (no daemon)")
    args = parser.parse_args()

    binary = find_server_binary()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            with server.client() as client:
                version = client.info("server").get("redis_version")
            for _ in range(args.runs):
                for name, figure in measure_round(server, tmp, args.jobs, http=not args.no_http).items():
                    results.setdefault(name, []).append(figure)
        finally:
            server.stop()

    print(f"jobcar {jobcar.__version__}, redis-py {redis.__version__}, aiohttp {aiohttp.__version__}, server "
          f"{binary} {version}, Python {platform.python_version()}, {args.runs} runs, median jobs/s")  # fmt: skip
    print(f"{'scenario':<18}{'jobs':>9}{'jobcar/s':>12}{'limit':>20}{'limit/s':>12}{'ratio':>8}")
    for pair in pairs(args.jobs, None if args.no_http else "-"):
        mine, limit = statistics.median(results[pair.name]), statistics.median(results[pair.limit_name])
        print(f"{pair.name:<18}{pair.jobs:>9}{mine:>12,.0f}{pair.limit_name:>20}{limit:>12,.0f}{mine / limit:>8.2f}")


if __name__ == "__main__":
    main()
