"""A minimal aiohttp handler app for benchmarks: POST anything, get 204. `python bench/noop_app.py PORT
[--uvloop]`, or `with serving() as app:` from a benchmark (a process of its own on a free port).

POST /sleep/<seconds> holds the request that long first (to keep jobs in flight); POST /batch answers a
batched delivery's JSON array with every job done; POST /v1/jobs parses its JSON job and answers 201 as
jobcar's API does, storing nothing: what the HTTP stack alone costs an enqueue (bench/enqueue.py, on uvloop
as the daemon runs)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import web


async def noop(request: web.Request) -> web.Response:
    body = await request.read()
    if request.path == "/v1/jobs":
        job = json.loads(body)
        answer = {"id": job.get("id") or "x", "queue": job.get("queue") or "default", "state": "pending",
                  "status": "created"}  # fmt: skip
        return web.Response(status=201, body=json.dumps(answer).encode(), content_type="application/json")
    if request.path == "/batch":
        answers = [{"id": job["id"], "outcome": "done"} for job in json.loads(body)]
        return web.Response(body=json.dumps(answers).encode(), content_type="application/json")
    if request.path.startswith("/sleep/"):
        await asyncio.sleep(float(request.path.removeprefix("/sleep/")))
    return web.Response(status=204)


@dataclass(frozen=True)
class Running:
    url: str  # the base URL, http://127.0.0.1:<port>
    pid: int


@contextmanager
def serving(*, on_uvloop: bool = False) -> Iterator[Running]:
    """This app in a process of its own on a free loopback port, accepting connections, until the block ends."""
    from tests.servers import free_port, stop_process, wait_for  # a benchmark has put the repository on sys.path

    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, str(port), *(["--uvloop"] if on_uvloop else [])])
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None, what="the no-op app")
        yield Running(f"http://127.0.0.1:{port}", process.pid)
    finally:
        stop_process(process)


def main() -> None:
    app = web.Application()
    app.router.add_post("/{tail:.*}", noop)
    loop = None
    if sys.argv[2:] == ["--uvloop"]:
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, loop=loop)


if __name__ == "__main__":
    main()
