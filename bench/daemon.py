"""End-to-end daemon figures beside their limits, in one run on one server.

    .venv/bin/python bench/daemon.py [--jobs 20000] [--concurrency 50] [--runs 3]

Scenarios (medians of --runs):
- HTTP no-op handler (a minimal aiohttp app in its own process): jobcar jobs/s from a paused backlog,
  beside a bare aiohttp client loop posting the same payloads to the same app at the same concurrency.
- Command handler /bin/true: jobcar jobs/s beside a bare asyncio create_subprocess_exec loop at the
  same concurrency (on uvloop, as the daemon runs).
- Pickup latency on an idle daemon: enqueue -> the HTTP handler sees the request, 500 jobs 10 ms apart.
- Delayed-job lateness: 200 jobs with delays spread over 0.2-2 s; handler arrival minus due time.
- Idle Redis commands/s per queue, from INFO commandstats over 10 s.

The daemon runs as `jobcar run` with its default log level (info: no line per successful job).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis
import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.daemon_harness import DaemonProcess, write_config
from tests.servers import RedisServer, find_server_binary, free_port, wait_for

import jobcar
from jobcar import AsyncClient, Client, transitions, transport
from jobcar.keys import QueueKeys
from noop_app import serving  # bench/noop_app.py

PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}
BODY = json.dumps(PAYLOAD, separators=(",", ":")).encode()


def run_daemon_backlog(
    server: RedisServer,
    tmp: Path,
    handler: dict[str, object],
    jobs: int,
    concurrency: int,
    daemons: int = 1,
    **settings: object,
) -> float:
    """jobs/s for a backlog enqueued while the queue is paused, from resume until the last ack.

    `daemons` > 1 runs that many `jobcar run` processes on the same config (each with `concurrency`),
    as replicas or systemd template units would: the peers run two worker processes on 2 cores.
    `settings` are more top-level config keys.
    """
    namespace = f"b{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"bench": handler}, concurrency=concurrency,
                          log_level="info", lease="30s", **settings)  # fmt: skip
    with server.client() as client:
        keys = QueueKeys.of(namespace, "default")
        transport.execute(client, [transitions.pause_call(keys, True)])
        Client(client, namespace=namespace).enqueue_many([("bench", PAYLOAD)] * jobs)
        running = [DaemonProcess(config).start() for _ in range(daemons)]
        try:
            elapsed = resume_and_drain(client, keys)
            failed = client.zcard(keys.dead)
            if failed:
                raise RuntimeError(f"{failed} jobs died: {running[0].log_tail()}")
        finally:
            for daemon in running:
                daemon.stop()
    return jobs / elapsed


def resume_and_drain(client: redis.Redis, keys: QueueKeys) -> float:
    """Resume a paused queue and wait until none of its jobs is pending, scheduled, active or held by a limit;
    the seconds."""
    started = time.perf_counter()
    transport.execute(client, [transitions.pause_call(keys, False)])

    def done() -> bool:
        stats = transitions.parse_stats(keys, transport.execute(client, [transitions.stats_call(keys)])[0])
        return stats.pending + stats.active + stats.scheduled + stats.held == 0

    wait_for(done, timeout=600, what="the backlog to drain")
    return time.perf_counter() - started


async def bare_http_loop(url: str, jobs: int, concurrency: int) -> float:
    remaining = jobs

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
                await resp.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return jobs / (time.perf_counter() - started)


async def bare_spawn_loop(argv: list[str], jobs: int, concurrency: int) -> float:
    remaining = jobs

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
            assert proc.stdin is not None
            # As the daemon does: a program that exits before reading stdin only makes the write moot.
            with contextlib.suppress(RuntimeError, ConnectionError):
                proc.stdin.write(BODY)
                proc.stdin.close()
            await proc.communicate()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return jobs / (time.perf_counter() - started)


def on_uvloop(coro: Awaitable[float]) -> float:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def recording_daemon(
    server: RedisServer, tmp: Path, clock: Callable[[], float] = time.monotonic, **top: Any
) -> AsyncIterator[tuple[str, dict[str, float]]]:
    """A `jobcar run` daemon whose job type "lat" posts to an in-process aiohttp handler that records when
    each job arrived (`clock()`, by job id). Yields (namespace, arrivals). `top`: more of the config."""
    arrivals: dict[str, float] = {}

    async def handler(request: web.Request) -> web.Response:
        arrivals[request.headers["Jobcar-Job-Id"]] = clock()
        await request.read()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/h", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    namespace = f"lat{time.monotonic_ns()}"
    config = write_config(tmp, server.url, namespace, {"lat": {"url": f"http://127.0.0.1:{port}/h"}},
                          log_level="info", **top)  # fmt: skip
    daemon = DaemonProcess(config)
    await asyncio.to_thread(daemon.start)
    try:
        yield namespace, arrivals
    finally:
        await asyncio.to_thread(daemon.stop)
        await runner.cleanup()


async def latency(server: RedisServer, tmp: Path) -> tuple[list[float], list[float]]:
    """(pickup latencies, delayed-job lateness) in ms, measured by an in-process HTTP handler."""
    async with (
        recording_daemon(server, tmp) as (namespace, arrivals),
        AsyncClient.from_url(server.url, namespace=namespace) as client,
    ):
        await client.enqueue("lat", None)  # warm the connections
        await asyncio.sleep(0.5)
        sent: dict[str, float] = {}
        for _ in range(500):
            t = time.monotonic()
            info = await client.enqueue("lat", PAYLOAD)
            sent[info.id] = t
            await asyncio.sleep(0.01)
        due: dict[str, float] = {}
        for n in range(200):
            delay = 0.2 + 1.8 * n / 200
            info = await client.enqueue("lat", PAYLOAD, delay=delay)
            due[info.id] = time.monotonic() + delay
            await asyncio.sleep(0.005)
        deadline = time.monotonic() + 30
        while not (sent.keys() | due.keys()) <= arrivals.keys() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    pickup = [(arrivals[i] - t) * 1000 for i, t in sent.items() if i in arrivals]
    lateness = [(arrivals[i] - t) * 1000 for i, t in due.items() if i in arrivals]
    return pickup, lateness


def idle_commands_per_queue(binary: str, tmp: Path, seconds: float = 10) -> float:
    server = RedisServer(binary, tmp / "idle").start()
    namespace = "idle"
    config = write_config(tmp, server.url, namespace, {"x": {"url": "http://127.0.0.1:9/"}}, log_level="info",
                          queues={"a": 1, "b": 1, "c": 1}, lease="30s")  # fmt: skip
    daemon = DaemonProcess(config).start()
    try:
        with server.client() as probe:
            time.sleep(1)

            def calls() -> int:
                return sum(int(v["calls"]) for k, v in probe.info("commandstats").items() if "info" not in k)

            before = calls()
            time.sleep(seconds)
            return (calls() - before) / seconds / 3
    finally:
        daemon.stop()
        server.stop()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    binary = find_server_binary()
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as directory, serving() as app:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            url = f"{app.url}/noop"
            figures: dict[str, list[float]] = {}
            small = max(1000, args.jobs // 10)
            scenarios: list[tuple[str, Callable[[], float]]] = [
                ("http jobcar", lambda: run_daemon_backlog(server, tmp, {"url": url}, args.jobs, args.concurrency)),
                ("http bare", lambda: on_uvloop(bare_http_loop(url, args.jobs, args.concurrency))),
                ("true jobcar", lambda: run_daemon_backlog(server, tmp, {"command": ["/bin/true"]}, small,
                                                           args.concurrency)),
                ("true bare", lambda: on_uvloop(bare_spawn_loop(["/bin/true"], small, args.concurrency))),
            ]  # fmt: skip
            for _ in range(args.runs):
                for name, scenario in scenarios:
                    figures.setdefault(name, []).append(scenario())
            pickup, lateness = on_uvloop_latency(server, tmp)
            idle = idle_commands_per_queue(binary, tmp)
            with server.client() as c:
                version = c.info("server").get("redis_version")
        finally:
            server.stop()

    med = {k: statistics.median(v) for k, v in figures.items()}
    http, http_bare, true, true_bare = (med[k] for k in ("http jobcar", "http bare", "true jobcar", "true bare"))
    rows.append(("no-op HTTP handler, jobs/s", f"{http:,.0f}", f"bare aiohttp loop {http_bare:,.0f}",
                 f"{http / http_bare:.2f}"))  # fmt: skip
    rows.append(("/bin/true command, jobs/s", f"{true:,.0f}", f"bare spawn loop {true_bare:,.0f}",
                 f"{true / true_bare:.2f}"))  # fmt: skip
    rows.append(("pickup latency p50 / p99, ms", f"{percentile(pickup, 0.5):.2f} / {percentile(pickup, 0.99):.2f}",
                 f"{len(pickup)} jobs, 10 ms apart", ""))  # fmt: skip
    late = f"{percentile(lateness, 0.5):.1f} / {percentile(lateness, 0.99):.1f}"
    rows.append(("delayed lateness p50 / p99, ms", late, f"{len(lateness)} jobs", ""))
    rows.append(("idle Redis commands/s per queue", f"{idle:.2f}", "3 idle queues, 10 s", ""))
    print(f"jobcar {jobcar.__version__}, server {binary} {version}, redis-py {redis.__version__}, aiohttp "
          f"{aiohttp.__version__}, uvloop {uvloop.__version__}, Python {platform.python_version()}, "
          f"concurrency {args.concurrency}, HTTP {args.jobs} jobs, command {max(1000, args.jobs // 10)} jobs, "
          f"medians of {args.runs}")  # fmt: skip
    print(f"{'figure':<34}{'jobcar':>18}   {'limit':<32}{'ratio':>6}")
    for name, mine, limit, ratio in rows:
        print(f"{name:<34}{mine:>18}   {limit:<32}{ratio:>6}")


def on_uvloop_latency(server: RedisServer, tmp: Path) -> tuple[list[float], list[float]]:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(latency(server, tmp))


if __name__ == "__main__":
    main()
