"""`jobcar ui`: the web dashboard on a listener of its own, for operators, with no jobs run; the same pages
the daemon serves at /ui (ui/pages.py), under the config's `api_token` and `ui.write`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Final

from aiohttp import web

from jobcar.admin import Admin
from jobcar.api import UI_PREFIX, bound_port, start_listener, to_dashboard
from jobcar.cli_support import CommandFailed, connected, load
from jobcar.config_types import Config
from jobcar.exit_codes import EX_CONFIG, EX_FAILURE, EX_OK
from jobcar.listen import exposure_problem, parse_listen
from jobcar.ui.pages import build_ui_app

DEFAULT_LISTEN: Final = "127.0.0.1:9322"


def ui_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"host:port to serve on (default {DEFAULT_LISTEN}; a non-loopback address needs api_token)",
    )


def cmd_ui(args: argparse.Namespace) -> int:
    config = load(args)
    try:
        parse_listen(args.listen)
    except ValueError as exc:
        raise CommandFailed(f"--listen: {exc}", EX_CONFIG) from None
    problem = exposure_problem(args.listen, config.has_api_token)
    if problem is not None:
        raise CommandFailed(f"{config.source}: {problem.replace('enqueue, read', 'read')}", EX_CONFIG)
    asyncio.run(_serve(config, args.listen))
    return EX_OK


async def _serve(config: Config, listen: str) -> None:
    """Serve until SIGINT or SIGTERM."""
    async with connected(config) as client:
        app = web.Application()
        app.router.add_get("/", to_dashboard)
        app.router.add_get(UI_PREFIX, to_dashboard)
        app.add_subapp(UI_PREFIX, build_ui_app(Admin(client, config.namespace, config.queues), config))
        try:
            listener = await start_listener(app, listen)
        except OSError as exc:
            raise CommandFailed(f"cannot listen on {listen}: {exc}", EX_FAILURE) from None
        try:
            host = listen.rpartition(":")[0]
            mode = "read-write" if config.ui.write else "read-only"
            print(f"jobcar dashboard ({mode}) on http://{host}:{bound_port(listener)}{UI_PREFIX}/", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await listener.cleanup()
