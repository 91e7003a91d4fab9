"""What does the dashboard cost? The history counters' cost on the hot path, and each page's server-side time
with 100,000 jobs in a queue.

    .venv/bin/python bench/dashboard.py [--jobs 20000] [--runs 5] [--backlog 100000] [--requests 20]

History: each round enqueues --jobs jobs into a paused queue, starts a `jobcar run` (concurrency 50, nginx's
`return 204;` as the handler), resumes the queue and times until every job is done; once with `history: true`
(the default: every finished attempt counted, flushed every 5 s) and once with `history: false`. Rounds
alternate; medians of --runs and the ratio on / off.

Pages: --backlog pending jobs in one queue and 10,000 dead ones (the dead-letter queue's default cap), 300 done
jobs kept; the dashboard (the same aiohttp app the daemon mounts at /ui) in this process, timed by a middleware
around its handlers: from the request's arrival to its response, Redis round trips included. Each page
--requests times; median and the slowest.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, find_server_binary

import jobcar
from daemon import run_daemon_backlog  # bench/daemon.py
from jobcar import AsyncClient, Client, transitions
from jobcar.admin import Admin
from jobcar.api import bound_port, start_listener
from jobcar.config_types import Config, UiSettings
from jobcar.keys import QueueKeys
from jobcar.ui.pages import build_ui_app
from nginx import Nginx, nginx_version

DEAD = 10_000
DONE = 300


def fill(server: RedisServer, namespace: str, backlog: int) -> str:
    """The queue the pages show: its dead and done jobs first (leased as the oldest), then the backlog. The id of
    one dead job."""
    with server.client() as client:
        client.flushdb()
        producer = Client(client, namespace=namespace)
        q = QueueDriver(client, namespace)
        producer.enqueue_many([("email.bounce", {"n": n}, {}) for n in range(DEAD + DONE)])
        leased: list[transitions.LeasedJob] = []
        while len(leased) < DEAD + DONE:
            leased += q.lease(count=500).jobs
        for n, job in enumerate(leased):
            if n < DEAD:
                q.kill(job.job.id, job.token, f"smtp 550: mailbox {n % 7} unavailable")
            else:
                q.ack(job.job.id, job.token, retention_ms=3_600_000)
        types = ("email.send", "image.resize", "report.build", "invoice.pdf")
        for start in range(0, backlog, 10_000):
            producer.enqueue_many([(types[n % 4], {"n": n, "to": f"user{n}@example.com"}, {})
                                   for n in range(start, min(backlog, start + 10_000))])  # fmt: skip
    return leased[0].job.id


async def time_pages(server: RedisServer, namespace: str, dead_id: str, requests: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {}

    @web.middleware
    async def timed(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:  # fmt: skip
        started = time.perf_counter()
        response = await handler(request)
        timings.setdefault(request.path_qs, []).append((time.perf_counter() - started) * 1000)
        return response

    client = AsyncClient.from_url(server.url, namespace=namespace)
    config = Config(source="bench", namespace=namespace, ui=UiSettings(write=True))
    app = web.Application(middlewares=[timed])
    app.add_subapp("/ui", build_ui_app(Admin(client.redis, namespace, ["default"]), config))
    listener = await start_listener(app, "127.0.0.1:0")
    pages = [
        "/ui/",
        "/ui/queues/default",
        "/ui/queues/default?state=pending&start=90000",
        "/ui/queues/default?state=pending&order=newest",
        "/ui/queues/default?state=pending&type=invoice.pdf",
        "/ui/queues/default?state=pending&id=zzz",
        "/ui/queues/default?state=dead",
        "/ui/queues/default?state=done",
        "/ui/queues/default/dead",
        "/ui/queues/default/dead?error=mailbox+3",
        f"/ui/job?queue=default&id={dead_id}",
        "/ui/schedules",
        "/ui/limits",
    ]
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{bound_port(listener)}") as http:
            for page in pages:
                for _ in range(requests):
                    async with http.get(page) as response:
                        assert response.status == 200, (page, response.status, await response.text())
                        await response.read()
    finally:
        await listener.cleanup()
        await client.close()
    return {page: timings[page] for page in pages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    binary = find_server_binary()
    figures: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as directory, Nginx() as url:
        tmp = Path(directory)
        server = RedisServer(binary, tmp / "redis").start()
        try:
            for _ in range(args.runs):
                for history in (True, False):
                    rate = run_daemon_backlog(server, tmp, {"url": url}, args.jobs, 50, history=history)
                    figures[history].append(rate)
                    print(f"  history {'on' if history else 'off'}: {rate:,.0f} jobs/s", flush=True)
            namespace = "pages"
            dead_id = fill(server, namespace, args.backlog)
            with server.client() as c:
                version = c.info("server").get("redis_version")
                held = c.llen(QueueKeys.of(namespace, "default").pending)
            timings = asyncio.run(time_pages(server, namespace, dead_id, args.requests))
        finally:
            server.stop()
    print(
        f"jobcar {jobcar.__version__}, server {binary} {version}, nginx {nginx_version()}, "
        f"Python {platform.python_version()}; {args.jobs} jobs per round, medians of {args.runs} (min-max)"
    )
    for history, label in ((True, "history on"), (False, "history off")):
        v = figures[history]
        print(f"{label:<14}{statistics.median(v):>10,.0f} jobs/s ({min(v):,.0f}-{max(v):,.0f})")
    print(f"{'ratio on/off':<14}{statistics.median(figures[True]) / statistics.median(figures[False]):>10.3f}")
    print(f"pages, server-side, {held:,} pending + {DEAD:,} dead + {DONE} done jobs, {args.requests} requests each:")
    for page, ms in timings.items():
        print(f"  {page:<52} median {statistics.median(ms):7.1f} ms   slowest {max(ms):7.1f} ms")


if __name__ == "__main__":
    main()
