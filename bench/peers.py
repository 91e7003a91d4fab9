"""Peers on one Redis server: arq, SAQ, RQ, Celery, Dramatiq and huey running an in-process no-op job.

    .venv-bench/bin/python bench/peers.py [--jobs 20000] [--runs 3] [--only arq,saq,rq,celery,dramatiq,huey]

The peers live in their own venv so they never touch jobcar's (bench/requirements.txt pins them):

    python3.11 -m venv .venv-bench && .venv-bench/bin/pip install -e '.[dev]' -r bench/requirements.txt

Figures per peer, all on the same redis-server started here (flushed between peers):
- throughput: jobs/s draining a backlog of --jobs no-op jobs, median of --runs. The backlog is enqueued
  with no worker running, its queue key is renamed away, the workers start and prove ready with one
  warm-up job, and the clock starts when the key is renamed back: worker start-up is not counted. It
  stops when the last job body starts (a no-op body ends there too).
- pickup latency p50/p99: enqueue -> job body starts, 200 jobs 10 ms apart on the idle, warm workers
  of the first run (the payload carries the enqueue wall-clock time).
- single-enqueue rate: --enqueue-jobs enqueues of one job each, every one waiting for its reply before
  the next (an asyncio peer's in one event-loop run), no worker running, median of --runs.
- Redis bytes per pending job: INFO memory used_memory delta over 10,000 jobs with a 100-byte JSON
  payload ({"ts": ..., "pad": ...}) and no worker running, after one warm-up job. The pad is random
  base64 so RQ's zlib-compressed job data cannot shrink it below what a real payload costs.

Every job body is `peer_tasks.started`: one datagram to this process, no Redis call (see there).

Worker setups for 2 cores, each peer as its documentation runs it, with per-job log lines off (as
jobcar, which logs no line per successful job):
- arq: 2 worker processes (arq is one asyncio process; its docs scale by running more), each with
  arq's defaults: max_jobs 10, poll_delay 0.5 s, results kept 1 h. Started by arq's `run_worker`
  (the CLI would force INFO logging). Under a backlog arq is bound by its poll, not by Redis or CPU:
  each poll reads the 100 oldest ids (queue_read_limit) and the next waits out the rest of poll_delay,
  so one process does at most 200 jobs/s; the two read the same ids and race for them with WATCH.
- SAQ: `saq ... --workers 2` (its own multi-process option), concurrency 10 per process (SAQ's default).
- RQ: 2 `rq worker --quiet` processes, RQ's default Worker, which forks a work horse per job (that
  fork is RQ's isolation model and most of its cost; SimpleWorker is not the default).
- Celery: `celery worker --concurrency 2` with the prefork pool (Celery's default pool and default
  concurrency = CPU count), default prefetch multiplier 4, no result backend, log level WARNING.
- Dramatiq: `dramatiq --processes 2 --threads 8`, which is Dramatiq's default on 2 cores (processes =
  CPU count, 8 threads each); Redis broker, default middleware.
- huey: `huey_consumer -k process -w 2 -q`: one worker process per core, since the job is Python code
  under the GIL (huey's docs: processes for CPU-bound work); Redis storage in its default blocking
  (BRPOP) mode.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import importlib.metadata
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # peer_tasks, as the workers import it

from tests.servers import RedisServer, find_server_binary, wait_for

BENCH = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
LATENCY_JOBS = 200
LATENCY_GAP = 0.01
PAYLOAD_BYTES = 100
READY_TIMEOUT = 90.0
HELD = "peers:held-backlog"
# The same pad for every job: random base64, so it compresses no better than a real payload would.
_PAD_CHARS = PAYLOAD_BYTES - len(json.dumps({"ts": time.time(), "pad": ""}, separators=(",", ":")))
PAD = base64.urlsafe_b64encode(os.urandom(_PAD_CHARS)).decode()[:_PAD_CHARS]


def payload() -> dict[str, object]:
    """A 100-byte JSON payload stamped with its enqueue wall-clock time."""
    return {"ts": time.time(), "pad": PAD}


class Producer(Protocol):
    def send(self, payload: dict[str, object]) -> None: ...

    def send_each(self, payloads: Sequence[dict[str, object]]) -> None:
        """One single enqueue after another (each waits for its reply): the single-enqueue rate."""
        ...

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None: ...

    def close(self) -> None: ...


def tasks(peer: str) -> ModuleType:
    return importlib.import_module(f"peer_tasks.{peer}_tasks")


class AsyncProducer:
    """A producer for an asyncio peer, driven from this synchronous harness on one long-lived loop."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.runner.run(coro)

    def each(
        self, send: Callable[[dict[str, object]], Coroutine[Any, Any, Any]], payloads: Sequence[dict[str, object]]
    ) -> None:
        async def one_after_another() -> None:
            for p in payloads:
                await send(p)

        self.run(one_after_another())  # one loop run for all: a run per call would time asyncio.Runner

    def gather(
        self,
        send: Callable[[dict[str, object]], Coroutine[Any, Any, Any]],
        payloads: Sequence[dict[str, object]],
        concurrency: int = 20,
    ) -> None:
        async def all_of_them() -> None:
            limit = asyncio.Semaphore(concurrency)

            async def one(p: dict[str, object]) -> None:
                async with limit:
                    await send(p)

            await asyncio.gather(*(one(p) for p in payloads))

        self.run(all_of_them())


class ArqProducer(AsyncProducer):
    def __init__(self, url: str) -> None:
        super().__init__()
        from arq.connections import RedisSettings, create_pool

        self.pool = self.run(create_pool(RedisSettings.from_dsn(url)))

    def send(self, payload: dict[str, object]) -> None:
        self.run(self.pool.enqueue_job("noop", payload))

    def send_each(self, payloads: Sequence[dict[str, object]]) -> None:
        self.each(lambda p: self.pool.enqueue_job("noop", p), payloads)

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None:
        self.gather(lambda p: self.pool.enqueue_job("noop", p), payloads)

    def close(self) -> None:
        self.run(self.pool.aclose())
        self.runner.close()


class SaqProducer(AsyncProducer):
    def __init__(self, url: str) -> None:
        super().__init__()
        from saq import Queue

        self.queue = Queue.from_url(url)
        self.run(self.queue.connect())

    def send(self, payload: dict[str, object]) -> None:
        self.run(self.queue.enqueue("noop", payload=payload))

    def send_each(self, payloads: Sequence[dict[str, object]]) -> None:
        self.each(lambda p: self.queue.enqueue("noop", payload=p), payloads)

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None:
        self.gather(lambda p: self.queue.enqueue("noop", payload=p), payloads)

    def close(self) -> None:
        self.run(self.queue.disconnect())
        self.runner.close()


class SyncProducer:
    """A producer whose `send` returns once the job is stored: single enqueues are a plain loop."""

    def send(self, payload: dict[str, object]) -> None:
        raise NotImplementedError

    def send_each(self, payloads: Sequence[dict[str, object]]) -> None:
        for p in payloads:
            self.send(p)


class RqProducer(SyncProducer):
    def __init__(self, url: str) -> None:
        from rq import Queue

        self.noop = tasks("rq").noop
        self.connection = redis.Redis.from_url(url)
        self.queue = Queue("default", connection=self.connection)

    def send(self, payload: dict[str, object]) -> None:
        self.queue.enqueue(self.noop, payload)

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None:
        for start in range(0, len(payloads), 500):
            chunk = payloads[start : start + 500]
            self.queue.enqueue_many([self.queue.prepare_data(self.noop, args=(p,)) for p in chunk])

    def close(self) -> None:
        self.connection.close()


class CeleryProducer(SyncProducer):
    def __init__(self, url: str) -> None:
        module = tasks("celery")
        self.app, self.noop = module.app, module.noop

    def send(self, payload: dict[str, object]) -> None:
        self.noop.apply_async((payload,))

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None:
        with self.app.producer_or_acquire() as producer:
            for p in payloads:
                self.noop.apply_async((p,), producer=producer)

    def close(self) -> None:
        self.app.close()


class CallProducer(SyncProducer):
    """Dramatiq (`actor.send`) and huey (calling the task enqueues it): one call per job."""

    def __init__(self, enqueue: Callable[[dict[str, object]], object], close: Callable[[], object]) -> None:
        self.enqueue, self.closer = enqueue, close

    def send(self, payload: dict[str, object]) -> None:
        self.enqueue(payload)

    def send_many(self, payloads: Sequence[dict[str, object]]) -> None:
        for p in payloads:
            self.enqueue(p)

    def close(self) -> None:
        self.closer()


def dramatiq_producer(url: str) -> Producer:
    module = tasks("dramatiq")
    return CallProducer(module.noop.send, module.broker.close)


def huey_producer(url: str) -> Producer:
    module = tasks("huey")
    return CallProducer(module.noop, module.huey.storage.conn.close)


@dataclass(frozen=True)
class Peer:
    name: str
    distribution: str
    setup: str
    queue_key: str  # the list or sorted set its workers take jobs from: renamed away to hold a backlog back
    producer: Callable[[str], Producer]
    workers: Callable[[], list[list[str]]]  # argv of each process to start


PEERS = (
    Peer("arq", "arq", "2 procs x max_jobs 10", "arq:queue", ArqProducer,
         lambda: [[sys.executable, "-m", "peer_tasks.arq_tasks"]] * 2),
    Peer("saq", "saq", "--workers 2 x concurrency 10", "saq:default:queued", SaqProducer,
         lambda: [[str(BIN / "saq"), "peer_tasks.saq_tasks.settings", "--workers", "2"]]),
    Peer("rq", "rq", "2 procs, fork per job", "rq:queue:default", RqProducer,
         lambda: [[str(BIN / "rq"), "worker", "--quiet", "--url", os.environ["PEERS_REDIS_URL"], "default"]] * 2),
    Peer("celery", "celery", "prefork 2, prefetch x4", "celery", CeleryProducer,
         lambda: [[str(BIN / "celery"), "-A", "peer_tasks.celery_tasks", "worker", "--concurrency", "2",
                   "--pool", "prefork", "--loglevel", "WARNING"]]),
    Peer("dramatiq", "dramatiq", "2 procs x 8 threads", "dramatiq:default", dramatiq_producer,
         lambda: [[str(BIN / "dramatiq"), "peer_tasks.dramatiq_tasks", "--processes", "2", "--threads", "8"]]),
    Peer("huey", "huey", "2 worker procs", "huey.redis.peers", huey_producer,
         lambda: [[str(BIN / "huey_consumer"), "peer_tasks.huey_tasks.huey", "-k", "process", "-w", "2", "-q"]]),
)  # fmt: skip


class Collector:
    """Receives the job bodies' datagrams: (enqueued at, started at) pairs, wall clock."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.records: list[tuple[float, float]] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._receive, name="collector", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        while not self.stopping:
            try:
                data = self.sock.recv(128)
            except TimeoutError:
                continue
            sent, started = data.split()
            self.records.append((float(sent), float(started)))

    def reset(self) -> None:
        self.records = []

    def wait(self, count: int, timeout: float, workers: Workers, what: str) -> list[tuple[float, float]]:
        deadline = time.monotonic() + timeout
        while len(self.records) < count:
            workers.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.records)}/{count} jobs started after {timeout:.0f}s ({what})")
            time.sleep(0.01)
        return self.records

    def close(self) -> None:
        self.stopping = True
        self.thread.join()
        self.sock.close()


@dataclass
class Workers:
    """A peer's worker processes, each in its own session so that their pools stop with them."""

    argvs: list[list[str]]
    env: dict[str, str]
    log: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> Workers:
        with self.log.open("ab") as out:
            for argv in self.argvs:
                self.processes.append(subprocess.Popen(argv, cwd=BENCH, env=self.env, stdout=out,
                                                       stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        return self

    def check(self) -> None:
        for p in self.processes:
            if p.poll() is not None:
                raise RuntimeError(f"worker exited with {p.returncode}: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])

    def __exit__(self, *exc: object) -> None:
        # SIGTERM is each peer's warm shutdown; whatever is left of a group after 10 s is killed.
        for p in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


@dataclass
class Result:
    name: str
    version: str
    setup: str
    throughput: list[float] = field(default_factory=list)
    pickup_ms: list[float] = field(default_factory=list)
    bytes_per_job: float | None = None
    enqueue: list[float] = field(default_factory=list)  # single enqueues/s, one run each
    error: str | None = None


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def shorten(text: str, width: int = 160) -> str:
    """An error as one table cell: the whole message is in the JSON line."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


@contextlib.contextmanager
def opened(peer: Peer, url: str) -> Iterator[Producer]:
    producer = peer.producer(url)
    try:
        yield producer
    finally:
        producer.close()


def measure(peer: Peer, result: Result, server: RedisServer, collector: Collector, args: argparse.Namespace,
            env: dict[str, str], log: Path) -> None:  # fmt: skip
    with server.client() as client, opened(peer, server.url) as producer:
        client.flushall()
        producer.send(payload())  # per-queue structures and script caches are not per-job costs
        before = used_memory(client)
        producer.send_many([payload() for _ in range(args.footprint_jobs)])
        result.bytes_per_job = (used_memory(client) - before) / args.footprint_jobs

        for run in range(args.runs):
            client.flushall()
            singles = [payload() for _ in range(args.enqueue_jobs)]
            began = time.perf_counter()
            producer.send_each(singles)
            result.enqueue.append(len(singles) / (time.perf_counter() - began))
            client.flushall()
            producer.send_many([payload() for _ in range(args.jobs)])
            client.rename(peer.queue_key, HELD)
            with Workers(peer.workers(), env, log) as workers:
                collector.reset()
                producer.send(payload())
                collector.wait(1, READY_TIMEOUT, workers, "warm-up job")
                wait_for(lambda: not client.exists(peer.queue_key), what="the warm-up job to leave the queue")
                collector.reset()
                began = time.time()
                client.rename(HELD, peer.queue_key)
                timeout = max(120.0, args.jobs / 20)
                records = collector.wait(args.jobs, timeout, workers, "backlog")
                result.throughput.append(args.jobs / (max(started for _, started in records) - began))
                if run == 0:
                    time.sleep(1)  # idle: let the drain's last acks and polls settle
                    collector.reset()
                    start = time.monotonic()
                    for n in range(LATENCY_JOBS):
                        producer.send(payload())
                        time.sleep(max(0.0, start + (n + 1) * LATENCY_GAP - time.monotonic()))
                    records = collector.wait(LATENCY_JOBS, 30, workers, "latency jobs")
                    result.pickup_ms = [(started - sent) * 1000 for sent, started in records]


def installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def bench_peer(peer: Peer, server: RedisServer, collector: Collector, args: argparse.Namespace, tmp: Path) -> Result:
    version = installed(peer.distribution)
    result = Result(peer.name, version, peer.setup)
    path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    log = tmp / f"{peer.name}.log"
    print(f"{peer.name} {version}: {peer.setup} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        measure(peer, result, server, collector, args, env, log)
    except ModuleNotFoundError as e:
        result.error = f"{e} (install bench/requirements.txt into .venv-bench)"
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(redis.RedisError), server.client() as client:
            client.flushall()
    took = time.monotonic() - started
    print(f"{peer.name}: {'failed' if result.error else 'done'} in {took:.0f}s", file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="backlog drained per throughput run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--footprint-jobs", type=int, default=10_000, help="pending jobs for bytes per job")
    parser.add_argument("--enqueue-jobs", type=int, default=10_000, help="single enqueues timed per run")
    parser.add_argument("--only", default="", help="comma-separated peers, e.g. arq,rq (default: all)")
    args = parser.parse_args()
    if min(args.jobs, args.runs, args.footprint_jobs, args.enqueue_jobs) < 1:
        parser.error("--jobs, --runs, --footprint-jobs and --enqueue-jobs must be at least 1")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(names) - {p.name for p in PEERS}
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; choose from {[p.name for p in PEERS]}")
    peers = [p for p in PEERS if not names or p.name in names]

    binary = find_server_binary()
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        # Set before any task module is imported: the harness's producers read it too.
        os.environ["PEERS_REDIS_URL"] = server.url
        os.environ["PEERS_SOCKET"] = str(tmp / "peers.sock")
        collector = Collector(tmp / "peers.sock")
        try:
            with server.client() as c:
                server_version = c.info("server").get("redis_version")
            for peer in peers:
                results.append(bench_peer(peer, server, collector, args, tmp))
        finally:
            collector.close()
            server.stop()

    versions = {d: installed(d) for d in ("redis", "hiredis", "kombu")}
    print(f"peers on {Path(binary).name} {server_version}, Python {platform.python_version()}, redis-py "
          f"{versions['redis']}, hiredis {versions['hiredis']}, kombu {versions['kombu']}, {os.cpu_count()} cores; "
          f"{args.jobs} jobs per throughput run, median of {args.runs}; pickup on {LATENCY_JOBS} jobs "
          f"{LATENCY_GAP * 1000:.0f} ms apart; bytes per pending job over {args.footprint_jobs} jobs, "
          f"{PAYLOAD_BYTES}-byte payload")  # fmt: skip
    print(f"{'peer':<10}{'version':<9}{'workers (2 cores)':<30}{'jobs/s':>9}  {'runs':<22}{'p50 ms':>9}"
          f"{'p99 ms':>9}{'bytes/job':>11}{'enqueue/s':>11}")  # fmt: skip
    figures: dict[str, dict[str, object]] = {}
    record: dict[str, object] = {
        "server": f"{Path(binary).name} {server_version}",
        "python": platform.python_version(),
        **versions,
        "cores": os.cpu_count(),
        "jobs": args.jobs,
        "runs": args.runs,
        "footprint_jobs": args.footprint_jobs,
        "enqueue_jobs": args.enqueue_jobs,
        "latency_jobs": LATENCY_JOBS,
        "peers": figures,
    }
    for r in results:
        head = f"{r.name:<10}{r.version:<9}{r.setup:<30}"
        entry: dict[str, object] = {"version": r.version, "setup": r.setup, "error": r.error}
        if r.throughput:
            entry["jobs_per_s"] = round(statistics.median(r.throughput), 1)
            entry["jobs_per_s_runs"] = [round(t, 1) for t in r.throughput]
        if r.pickup_ms:
            entry["pickup_p50_ms"] = round(percentile(r.pickup_ms, 0.5), 3)
            entry["pickup_p99_ms"] = round(percentile(r.pickup_ms, 0.99), 3)
        if r.bytes_per_job is not None:
            entry["redis_bytes_per_pending_job"] = round(r.bytes_per_job)
        if r.enqueue:
            entry["enqueue_jobs_per_s"] = round(statistics.median(r.enqueue), 1)
            entry["enqueue_jobs_per_s_runs"] = [round(e, 1) for e in r.enqueue]
        figures[r.name] = entry
        if r.error and not r.throughput:
            print(f"{head}error: {shorten(r.error)}")
            continue
        runs = "/".join(f"{t:,.0f}" for t in r.throughput)
        p50 = f"{entry['pickup_p50_ms']:.2f}" if r.pickup_ms else "-"
        p99 = f"{entry['pickup_p99_ms']:.2f}" if r.pickup_ms else "-"
        size = f"{r.bytes_per_job:,.0f}" if r.bytes_per_job is not None else "-"
        median = f"{statistics.median(r.throughput):,.0f}" if r.throughput else "-"
        single = f"{statistics.median(r.enqueue):,.0f}" if r.enqueue else "-"
        print(f"{head}{median:>9}  {runs:<22}{p50:>9}{p99:>9}{size:>11}{single:>11}")
        if r.error:
            print(f"{'':<10}error after {len(r.throughput)} runs: {shorten(r.error)}")
    print(json.dumps(record, separators=(",", ":")))


if __name__ == "__main__":
    main()
