"""A minimal aiohttp handler app for benchmarks: POST anything, get 204. `python bench/noop_app.py PORT`.

POST /sleep/<seconds> holds the request that long first (to keep jobs in flight)."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web


async def noop(request: web.Request) -> web.Response:
    await request.read()
    if request.path.startswith("/sleep/"):
        await asyncio.sleep(float(request.path.removeprefix("/sleep/")))
    return web.Response(status=204)


def main() -> None:
    app = web.Application()
    app.router.add_post("/{tail:.*}", noop)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
