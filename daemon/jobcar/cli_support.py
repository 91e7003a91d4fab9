"""What every `jobcar` command shares: exit codes, the config file, the Redis connection, output.

Split from cli.py (which holds the parser and the producer-side commands) and cli_ops.py (the
operators' commands) so that both can use it without importing each other. The parser uses this module
before any command runs, so what only a command needs (the config loader, redis-py, Admin) is imported
inside the function that needs it: `jobcar --version` or `--help` loads none of it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from jobcar.exit_codes import EX_CONFIG, EX_FAILURE, EX_UNAVAILABLE, EX_USAGE
from jobcar.units import parse_duration

if TYPE_CHECKING:
    from jobcar.admin import Admin
    from jobcar.config_types import Config
    from jobcar.transport import AsyncRedis

CONFIG_ENV: Final = "JOBCAR_CONFIG"
DEFAULT_CONFIG: Final = "jobcar.yaml"
CONFIG_HELP: Final = f"config file (default: ${CONFIG_ENV}, else ./{DEFAULT_CONFIG})"
ID_DASH: Final = "an id that starts with - goes after --"
ID_HELP: Final = f"the job's id ({ID_DASH})"
#: A CLI call waits this long for Redis to accept a connection, and for each reply, before giving up.
CONNECT_TIMEOUT: Final = 5.0

T = TypeVar("T")


class CommandFailed(Exception):
    """Ends a command with `code`, printing `lines` to stderr as they are, or `message` after "jobcar: "."""

    def __init__(self, message: str, code: int = EX_FAILURE, *, lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.lines = list(lines) or [f"jobcar: {message}"]


# -- shared by the commands -----------------------------------------------------------------------


def config_path(args: argparse.Namespace) -> str:
    path: str | None = getattr(args, "action_config", None) or args.config or args.global_config
    path = path or os.environ.get(CONFIG_ENV)
    return path or DEFAULT_CONFIG


def load(args: argparse.Namespace, *, secrets_needed: bool = False) -> Config:
    """The config named by the arguments, or CommandFailed(78) listing every problem. Handlers' secrets
    (headers, signing secrets, environment) may be unset unless the command runs or checks handlers."""
    from jobcar.config import ConfigError, load_config

    try:
        return load_config(config_path(args), secrets_needed=secrets_needed)
    except ConfigError as exc:
        raise CommandFailed(str(exc), EX_CONFIG, lines=exc.errors) from None


def _embedded_not_running(config: Config) -> CommandFailed:
    return CommandFailed(
        f"{config.source}: redis.url is 'embedded', and no embedded server runs on "
        f"{Path(config.redis.data_dir).resolve()}: it runs only inside `jobcar run`. Start "
        f"`jobcar run -c {config.source}` (from this directory: redis.data_dir is relative to it), "
        "or set redis.url to a Redis server",
        EX_UNAVAILABLE,
    )


@asynccontextmanager
async def connected(config: Config) -> AsyncIterator[AsyncRedis]:
    """A redis client for the config's server, closed on exit. Connection failures (at any point inside
    the block) become CommandFailed(69); other Redis errors CommandFailed(1).

    With `url: embedded`, this reaches the embedded server of a `jobcar run` on the same data directory
    through its unix socket, if one is running.
    """
    import redis.asyncio
    import redis.exceptions

    from jobcar.redis_url import EMBEDDED_URL, is_sentinel_url, shown_url
    from jobcar.sentinel import async_sentinel_client
    from jobcar.transport import COMMAND_TIMEOUT

    url = config.redis.url
    embedded = url == EMBEDDED_URL
    if embedded:
        from jobcar.embedded import EmbeddedServerError, running_server_url

        try:
            url = running_server_url(config.redis.data_dir)
        except EmbeddedServerError:
            raise _embedded_not_running(config) from None
    options: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": COMMAND_TIMEOUT}
    try:
        client: AsyncRedis
        if config.redis.cluster and not embedded:
            client = redis.asyncio.RedisCluster.from_url(url, **options)
        elif is_sentinel_url(url):
            client = async_sentinel_client(url, **options)
        else:
            client = redis.asyncio.Redis.from_url(url, **options)
    except ValueError as exc:  # a scheme redis-py does not take
        raise CommandFailed(f"{config.source}: redis.url: {shown_url(str(exc))}", EX_CONFIG) from None
    try:
        yield client
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.RedisClusterException,
        OSError,
    ) as exc:
        if embedded:
            raise _embedded_not_running(config) from None  # a socket left behind by a killed server
        raise CommandFailed(f"cannot reach Redis at {shown_url(url)}: {exc}", EX_UNAVAILABLE) from None
    except redis.exceptions.RedisError as exc:
        # redis-py strips the code off the replies it has a class for (OOM, READONLY, NOPERM, ...): name the class.
        kind = "" if type(exc) is redis.exceptions.ResponseError else f"{type(exc).__name__}: "
        raise CommandFailed(f"Redis refused the command: {kind}{exc}", EX_FAILURE) from None
    finally:
        await client.aclose()


def with_admin(config: Config, work: Callable[[Admin], Awaitable[T]]) -> T:
    """Run `work` on an Admin over the config's server (see `connected`) in an event loop of its own. A job
    that is not there, or in several queues, ends the command with a message naming what to do."""
    import asyncio

    from jobcar.admin import Admin
    from jobcar.admin_reads import AmbiguousJob, JobNotFound

    async def main() -> T:
        async with connected(config) as client:
            return await work(Admin(client, config.namespace, config.queues))

    try:
        return asyncio.run(main())
    except JobNotFound as exc:
        raise CommandFailed(str(exc)) from None
    except AmbiguousJob as exc:
        raise CommandFailed(f"{exc}; choose one with --queue", EX_USAGE) from None


def print_json(value: object) -> None:
    print(json.dumps(value, ensure_ascii=False))


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return int(text)
