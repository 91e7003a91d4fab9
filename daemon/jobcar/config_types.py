"""The daemon's configuration as frozen dataclasses. `config.py` builds them from YAML.

Durations are float seconds and sizes int bytes: they are normalised at the edge (config.py), so the
rest of the daemon never parses "30s" or "1MiB".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from jobcar.schedules import ScheduleSpec
from jobcar.targets import KnownTargets

#: Variables of the daemon's own environment that every command handler receives.
DEFAULT_ENV_ALLOW: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER")


class BackoffStrategy(StrEnum):
    EXPONENTIAL = "exponential"  # base * 2^(attempt-1), full jitter, capped at max
    LINEAR = "linear"  # base * attempt, full jitter, capped at max
    CONSTANT = "constant"  # base, no jitter


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    strategy: BackoffStrategy = BackoffStrategy.EXPONENTIAL
    base: float = 1.0
    max: float = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Defaults:
    """Per-handler settings that apply unless a handler overrides them."""

    timeout: float = 60.0
    max_attempts: int = 10
    backoff: Backoff = field(default_factory=Backoff)
    #: Longest `Retry-After` a handler may ask for; a larger one is cut to this (a handler cannot park a
    #: job forever without spending attempts).
    max_retry_after: float = 3600.0


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` starts per `period` seconds, evenly spaced (GCRA), `burst` of them at once."""

    count: int
    period: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """A job type's concurrency limits across every daemon of the namespace, held in Redis (ADR 0014)."""

    #: At most this many jobs of the type run at once, fleet-wide.
    concurrency: int | None = None
    #: At most this many jobs of one key run at once, fleet-wide.
    per_key: int | None = None
    #: At most this many starts of the type per period, fleet-wide; `burst` of them at once.
    rate: Rate | None = None
    burst: int = 1
    #: The same for each key.
    per_key_rate: Rate | None = None
    per_key_burst: int = 1
    #: Keys take turns for the type's `concurrency` slots (round robin) instead of first come, first served.
    fair: bool = False
    #: What a handler's 429 with Retry-After holds back: "job" (that job only), "type" or "key".
    on_429: str = "job"
    #: Where a job's key comes from: "key" (the producer's `key=`), "meta.<name>" or "payload.<name>" (a
    #: top-level field of a JSON object payload).
    key: str = "key"


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchDelivery:
    """Jobs of a type delivered to its handler together: one POST or one command run (batching.py, ADR 0015)."""

    #: At most this many jobs in one call.
    max_size: int = 100
    #: Seconds the first job of a forming batch waits for more before the batch is sent as it is.
    max_wait: float = 0.2
    #: Jobs whose keys differ never share a batch: "key", "meta.<name>" or "payload.<name>" (as `Limits.key`).
    key: str | None = None


#: A handler's `max_snoozes` unless set.
DEFAULT_MAX_SNOOZES: Final = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerBase:
    type: str
    timeout: float
    max_attempts: int
    backoff: Backoff
    max_retry_after: float
    #: At most this many jobs of this type run at once in this daemon (None: only the global limit).
    concurrency: int | None = None
    #: Fleet-wide limits, enforced in Redis by the lease (None: none).
    limits: Limits | None = None
    #: Deliver jobs in batches (None: one call per job). `concurrency` then counts calls, not jobs.
    batch: BatchDelivery | None = None
    #: How much longer than its timeout an attempt may run once its handler asked for more time (the handler
    #: API's extend); 0: no extension.
    max_extend: float = 0.0
    #: How many times a job may come back later without spending an attempt over its life: its handler's
    #: snoozes and its 429/503 answers with Retry-After together. Past it, they spend an attempt.
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    #: Backpressure per type: the most jobs of this type, pending or held, an enqueue may leave each of the
    #: config's queues with (None: no bound of its own). The daemons write it to Redis (queue_settings.py).
    max_pending: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpHandler(HandlerBase):
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    #: When set, each request carries `Jobcar-Signature` (HMAC-SHA256 over timestamp and body).
    signing_secret: str | None = None
    #: Response bodies are read up to this many bytes (kept as the job's result on success).
    max_response_bytes: int = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandHandler(HandlerBase):
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    #: Names of the daemon's own environment variables passed on, in addition to DEFAULT_ENV_ALLOW.
    env_allow: tuple[str, ...] = ()
    permanent_exit_codes: frozenset[int] = frozenset()
    #: Time between SIGTERM and SIGKILL to the handler's process group on timeout, cancel or drain.
    kill_grace: float = 5.0
    #: stdout and stderr are each captured up to this many bytes; the rest is read and dropped.
    max_output_bytes: int = 64 * 1024
    cwd: str | None = None
    #: The command's stderr lines also go to the job's log (the handler API), as they come.
    log_stderr: bool = False


Handler = HttpHandler | CommandHandler


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisSettings:
    #: redis://, rediss://, unix://, or "embedded" (a bundled server, for development).
    url: str = "redis://127.0.0.1:6379/0"
    #: The url names a node of a Redis Cluster.
    cluster: bool = False
    #: Refuse to start (instead of warning) when the server's eviction policy is not noeviction or AOF is off.
    strict: bool = False
    #: Data directory of the embedded server.
    data_dir: str = ".jobcar-data"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    max_jobs: int = 10_000
    max_age: float = 180 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class UiSettings:
    """The web dashboard at /ui on the daemon's listener (and `jobcar ui`)."""

    enabled: bool = True
    #: Whether its buttons act (cancel, requeue, delete, pause, trigger); read-only by default.
    write: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerApiSettings:
    """The local API a handler calls during its attempt (handler_api.py, docs/handler-api.md)."""

    #: The base URL handlers are given (None: this daemon's `listen` address, a wildcard one as loopback).
    url: str | None = None
    #: A job's log keeps at most this many lines and bytes; the oldest go first, counted.
    max_log_lines: int = 1000
    max_log_bytes: int = 256 * 1024
    #: A longer line is cut to this many bytes.
    max_line_bytes: int = 4096
    #: A job keeps at most this many durable steps, each of at most `max_step_bytes`.
    max_steps: int = 100
    max_step_bytes: int = 1024 * 1024
    #: A job's handlers may make at most this many children over its life.
    max_children: int = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingSettings:
    """OpenTelemetry: spans (and optionally the metrics) exported over OTLP/HTTP (tracing.py, docs/observability.md)."""

    #: Off: no OpenTelemetry module is imported and nothing is recorded.
    enabled: bool = False
    #: The collector's OTLP/HTTP base URL; `/v1/traces` and `/v1/metrics` are appended.
    endpoint: str = "http://127.0.0.1:4318"
    #: Sent with every export (a collector's credentials, e.g. an API key).
    headers: dict[str, str] = field(default_factory=dict)
    service_name: str = "jobcar"
    #: The share of new traces recorded; a span whose parent (the producer's) was sampled or not follows it.
    sampling_ratio: float = 1.0
    #: Also push the metrics of /metrics over OTLP this often (0: not pushed).
    metrics_interval: float = 0.0
    #: The dashboard links a job to its trace here: `{trace_id}` is replaced (works with tracing off too).
    trace_url: str | None = None


#: The name `api_token`'s token goes by (in the logs, api_tokens.py); no token of `api_tokens` may take it.
LEGACY_TOKEN_NAME: Final = "api_token"


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiTokenSetting:
    """One of `api_tokens`: a named bearer token of the API and the dashboard, with its role (api_tokens.py)."""

    name: str
    role: str  # read, produce or operate
    #: The token, from the file (`token`, ${VAR} expanded) or read from `token_file` when the config is loaded;
    #: None when that file could not be read by a command that runs no daemon. Never shown.
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    source: str  # the file it was read from, for messages
    redis: RedisSettings = field(default_factory=RedisSettings)
    namespace: str = "jobcar"
    queues: dict[str, int] = field(default_factory=lambda: {"default": 1})
    #: The keys of `queues` that are patterns (`tenant-*`), each with its weight, in the file's order: every
    #: queue producers register that one matches and no literal names is served too (ADR 0027). A reload
    #: may change them; `queues` (the names) only a restart.
    queue_patterns: dict[str, int] = field(default_factory=dict)
    strict_priority: bool = False
    concurrency: int = 20
    lease: float = 30.0
    #: Time in-flight jobs get to finish on SIGTERM. Keep it below the platform's own deadline:
    #: Kubernetes terminationGracePeriodSeconds, `docker stop -t`/compose stop_grace_period, systemd TimeoutStopSec.
    shutdown_timeout: float = 30.0
    listen: str = "127.0.0.1:9321"
    api_token: str | None = None
    #: Host names, besides loopback names and IP addresses, that the API answers to while api_token is unset
    #: (a Host check against DNS rebinding: browser_guard.py). Lower case.
    api_allowed_hosts: tuple[str, ...] = ()
    #: Named tokens with a role each, besides api_token (an operate token): api_tokens.py, ADR 0026.
    api_tokens: tuple[ApiTokenSetting, ...] = ()
    #: While this URL of the app does not answer 2xx, no jobs are leased (app health gates leasing).
    health_url: str | None = None
    log_level: str = "info"
    log_format: str = "auto"  # auto (JSON unless stdout is a terminal), json, console
    #: How long a finished job and its result stay readable; 0 deletes a job when it succeeds.
    result_ttl: float = 0.0
    max_payload_bytes: int = 1024 * 1024
    defaults: Defaults = field(default_factory=Defaults)
    dead_letter: DeadLetter = field(default_factory=DeadLetter)
    handlers: dict[str, Handler] = field(default_factory=dict)
    #: Periodic jobs: kept in Redis by every daemon of the fleet, fired by any (scheduler.py).
    schedules: tuple[ScheduleSpec, ...] = ()
    ui: UiSettings = field(default_factory=UiSettings)
    handler_api: HandlerApiSettings = field(default_factory=HandlerApiSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    #: Backpressure (ADR 0024): queue -> the most pending jobs an enqueue may leave it with, written to Redis for
    #: the enqueue script by the daemons serving the queue, at start and on reload (runner.py).
    max_pending: dict[str, int] = field(default_factory=dict)
    #: Keep fleet-wide counts of finished attempts per 10 s (history.py): `jobcar stats`, the dashboard's charts.
    history: bool = True
    #: Refuse, rather than warn of, an enqueue by a producer that knows this config (the CLI, the HTTP API,
    #: `Client.from_config`) of a type no handler runs or to a queue this config does not serve (targets.py).
    strict_enqueue: bool = False

    @property
    def has_api_token(self) -> bool:
        """Whether any token guards the API: api_token, or one of api_tokens."""
        return bool(self.api_token or self.api_tokens)

    def known_targets(self) -> KnownTargets:
        """The types and queues this config runs, for a producer's check of what it enqueues."""
        return KnownTargets(self.source, frozenset(self.handlers), frozenset(self.queues), self.strict_enqueue,
                            tuple(self.queue_patterns))  # fmt: skip


def limit_rules(config: Config) -> str:
    """The handlers' fleet-wide limits as the lease and reap scripts take them: a JSON object type -> rule
    ("{}" for none, which the scripts pass over at no cost)."""
    return json.dumps(limit_rule_table(config), separators=(",", ":"), sort_keys=True)


def limit_rule_table(config: Config) -> dict[str, dict[str, Any]]:
    """`limit_rules` before it is encoded."""
    rules: dict[str, dict[str, Any]] = {}
    for job_type, handler in config.handlers.items():
        if handler.limits is None:
            continue
        rule: dict[str, Any] = {}
        if handler.limits.concurrency is not None:
            rule["total"] = handler.limits.concurrency
        if handler.limits.per_key is not None:
            rule["per_key"] = handler.limits.per_key
        if handler.limits.rate is not None:
            rule["rate"] = [handler.limits.rate.count, round(handler.limits.rate.period * 1000)]
            rule["burst"] = handler.limits.burst
        if handler.limits.per_key_rate is not None:
            rule["key_rate"] = [handler.limits.per_key_rate.count, round(handler.limits.per_key_rate.period * 1000)]
            rule["key_burst"] = handler.limits.per_key_burst
        if handler.limits.fair:
            rule["fair"] = True
        if handler.limits.on_429 != "job":
            rule["hold"] = handler.limits.on_429
        keyed = handler.limits.per_key is not None or handler.limits.per_key_rate is not None
        if keyed or "hold" in rule or "fair" in rule:
            rule["key"] = handler.limits.key
        rules[job_type] = rule
    return rules
