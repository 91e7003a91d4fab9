"""The config loader: YAML to frozen dataclasses, interpolation, units, every error with its place."""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from jobcar.config import KNOWN_KEYS, ConfigError, load_config, parse_config
from jobcar.config_types import (
    Backoff,
    BackoffStrategy,
    BatchDelivery,
    CommandHandler,
    Config,
    DeadLetter,
    Defaults,
    HandlerApiSettings,
    HttpHandler,
    Limits,
    Rate,
    RedisSettings,
    TracingSettings,
    UiSettings,
)
from jobcar.names import QUEUE_PATTERN
from jobcar.units import interpolate, parse_duration, parse_size

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.json"

# A full config as a user writes one: comments, ${VAR} references, every section.
FULL_EXAMPLE = """\
redis:
  url: ${REDIS_URL:-redis://127.0.0.1:6379/0}   # or rediss://, or redis+sentinel://; `embedded` starts a bundled server
namespace: jobcar
queues: {critical: 6, default: 3, low: 1}        # weights; `strict_priority: true` drains in order
concurrency: 20                                    # max jobs running at once in this daemon
lease: 30s
shutdown_timeout: 30s
listen: 127.0.0.1:9321                             # /metrics, /healthz, /readyz, /v1/jobs
api_token: ${JOBCAR_API_TOKEN:-}                   # required for /v1/jobs when listen is not loopback
defaults: {timeout: 60s, max_attempts: 10, backoff: {base: 1s, max: 1h}}
handlers:
  email.welcome:
    url: http://127.0.0.1:8080/jobs/email-welcome
    timeout: 10s
    max_attempts: 5
    backoff: {base: 2s, max: 10m}
    headers: {Authorization: "Bearer ${APP_TOKEN}"}
  image.resize:
    command: [/usr/local/bin/resize, --quality, "80"]
    timeout: 2m
    concurrency: 2
    env: {TMPDIR: /var/tmp}
    permanent_exit_codes: [64, 65]
"""


def parse(text: str, environ: Mapping[str, str] | None = None) -> Config:
    return parse_config(textwrap.dedent(text), "jobcar.yaml", environ or {})


def errors_of(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(text, environ)
    return caught.value.errors


# -- valid configs --------------------------------------------------------------------------------------


def test_design_example_parses_to_the_expected_dataclasses() -> None:
    config = parse(FULL_EXAMPLE, {"APP_TOKEN": "s3cret"})

    defaults = Defaults(timeout=60.0, max_attempts=10, backoff=Backoff(base=1.0, max=3600.0))
    assert config == Config(
        source="jobcar.yaml",
        redis=RedisSettings(url="redis://127.0.0.1:6379/0"),
        namespace="jobcar",
        queues={"critical": 6, "default": 3, "low": 1},
        concurrency=20,
        lease=30.0,
        shutdown_timeout=30.0,
        listen="127.0.0.1:9321",
        api_token=None,
        defaults=defaults,
        handlers={
            "email.welcome": HttpHandler(
                type="email.welcome",
                url="http://127.0.0.1:8080/jobs/email-welcome",
                timeout=10.0,
                max_attempts=5,
                backoff=Backoff(strategy=BackoffStrategy.EXPONENTIAL, base=2.0, max=600.0),
                max_retry_after=3600.0,
                headers={"Authorization": "Bearer s3cret"},
            ),
            "image.resize": CommandHandler(
                type="image.resize",
                command=("/usr/local/bin/resize", "--quality", "80"),
                timeout=120.0,
                max_attempts=10,
                backoff=defaults.backoff,
                max_retry_after=3600.0,
                concurrency=2,
                env={"TMPDIR": "/var/tmp"},
                permanent_exit_codes=frozenset({64, 65}),
            ),
        },
    )
    assert list(config.queues) == ["critical", "default", "low"]  # order is priority with strict_priority


def test_design_example_takes_redis_url_and_token_from_the_environment() -> None:
    environ = {"APP_TOKEN": "t", "REDIS_URL": "rediss://cache:6380/1", "JOBCAR_API_TOKEN": "api"}
    config = parse(FULL_EXAMPLE, environ)
    assert config.redis.url == "rediss://cache:6380/1"
    assert config.api_token == "api"


def test_api_allowed_hosts_are_lower_case_names() -> None:
    config = parse("api_allowed_hosts: [Jobcar.Internal, jobcar, my_host.local]\n")
    assert config.api_allowed_hosts == ("jobcar.internal", "jobcar", "my_host.local")
    assert parse("{}").api_allowed_hosts == ()


def test_an_empty_file_is_all_defaults() -> None:
    assert parse("") == Config(source="jobcar.yaml")
    assert parse("# nothing here\n") == Config(source="jobcar.yaml")


def test_every_key_can_be_set() -> None:
    config = parse(
        """\
        redis: {url: embedded, strict: true, data_dir: /var/lib/jobcar}
        namespace: shop
        queues: {high: 2, low: 1}
        strict_priority: yes
        concurrency: 8
        lease: 1m
        shutdown_timeout: 25s
        listen: "[::1]:9400"
        api_token: tok
        health_url: http://127.0.0.1:8080/health
        log_level: DEBUG
        log_format: json
        result_ttl: 1h
        max_payload_bytes: 256KiB
        defaults:
          timeout: 45s
          max_attempts: 7
          backoff: {strategy: linear, base: 500ms, max: 2m}
          max_retry_after: 10m
        dead_letter: {max_jobs: 500, max_age: 7d}
        handlers:
          report.build:
            url: https://app.internal/jobs/report
            timeout: 5m
            max_attempts: 2
            backoff: {strategy: constant}
            max_retry_after: 30s
            concurrency: 1
            limits: {concurrency: 4, per_key: 1, key: payload.tenant, rate: 100/s, burst: 10, per_key_rate: 3/500ms,
                     per_key_burst: 2, on_429: key, fair: true}
            headers: {X-Tenant: acme}
            signing_secret: hush
            max_response_bytes: 1MiB
          pdf:render:
            command: [/bin/render, --dpi, 300]
            env: {MODE: fast}
            env_allow: [AWS_REGION]
            permanent_exit_codes: [2]
            kill_grace: 10s
            max_output_bytes: 10KB
            cwd: /srv
            batch: {max_size: 8, max_wait: 1s, key: meta.tenant}
        """
    )
    defaults = Defaults(
        timeout=45.0,
        max_attempts=7,
        backoff=Backoff(strategy=BackoffStrategy.LINEAR, base=0.5, max=120.0),
        max_retry_after=600.0,
    )
    assert config == Config(
        source="jobcar.yaml",
        redis=RedisSettings(url="embedded", strict=True, data_dir="/var/lib/jobcar"),
        namespace="shop",
        queues={"high": 2, "low": 1},
        strict_priority=True,
        concurrency=8,
        lease=60.0,
        shutdown_timeout=25.0,
        listen="[::1]:9400",
        api_token="tok",
        health_url="http://127.0.0.1:8080/health",
        log_level="debug",
        log_format="json",
        result_ttl=3600.0,
        max_payload_bytes=256 * 1024,
        defaults=defaults,
        dead_letter=DeadLetter(max_jobs=500, max_age=7 * 86400.0),
        handlers={
            "report.build": HttpHandler(
                type="report.build",
                url="https://app.internal/jobs/report",
                timeout=300.0,
                max_attempts=2,
                backoff=Backoff(strategy=BackoffStrategy.CONSTANT, base=0.5, max=120.0),
                max_retry_after=30.0,
                concurrency=1,
                limits=Limits(
                    concurrency=4,
                    per_key=1,
                    key="payload.tenant",
                    rate=Rate(100, 1.0),
                    burst=10,
                    per_key_rate=Rate(3, 0.5),
                    per_key_burst=2,
                    fair=True,
                    on_429="key",
                ),
                headers={"X-Tenant": "acme"},
                signing_secret="hush",
                max_response_bytes=1024 * 1024,
            ),
            "pdf:render": CommandHandler(
                type="pdf:render",
                command=("/bin/render", "--dpi", "300"),
                timeout=45.0,
                max_attempts=7,
                backoff=defaults.backoff,
                max_retry_after=600.0,
                env={"MODE": "fast"},
                env_allow=("AWS_REGION",),
                permanent_exit_codes=frozenset({2}),
                kill_grace=10.0,
                max_output_bytes=10_000,
                cwd="/srv",
                batch=BatchDelivery(max_size=8, max_wait=1.0, key="meta.tenant"),
            ),
        },
    )


def test_tracing_is_off_by_default_and_every_key_can_be_set() -> None:
    assert parse("namespace: x\n").tracing == TracingSettings(enabled=False)
    config = parse(
        """\
        tracing:
          enabled: true
          endpoint: https://otlp.example:4318
          headers: {x-api-key: "${KEY}"}
          service_name: shop-jobs
          sampling_ratio: "0.25"
          metrics_interval: 15s
          trace_url: http://jaeger:16686/trace/{trace_id}
        """,
        {"KEY": "k1"},
    )
    assert config.tracing == TracingSettings(
        enabled=True,
        endpoint="https://otlp.example:4318",
        headers={"x-api-key": "k1"},
        service_name="shop-jobs",
        sampling_ratio=0.25,
        metrics_interval=15.0,
        trace_url="http://jaeger:16686/trace/{trace_id}",
    )
    # An empty endpoint (an unset variable) is the default one, not an error.
    assert parse("tracing: {endpoint: '${E:-}'}\n").tracing.endpoint == "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tracing: {sampling_ratio: 1.5}", "jobcar.yaml:1:27 tracing.sampling_ratio: must be from 0 to 1, not '1.5'"),
        ("tracing: {sampling_ratio: half}", "jobcar.yaml:1:27 tracing.sampling_ratio: must be a number from 0 to 1"),
        ("tracing: {trace_url: 'http://j/trace'}", "jobcar.yaml:1:22 tracing.trace_url: must hold {trace_id}"),
        ("tracing: {endpoint: 'grpc://c:4317'}", "jobcar.yaml:1:21 tracing.endpoint: must be an http:// or https://"),
        ("tracing: {headers: {'bad name': x}}", "jobcar.yaml:1:21 tracing.headers.bad name: invalid name"),
        ("tracing: {exporter: otlp}", "jobcar.yaml:1:11 tracing.exporter: unknown key"),
    ],
)
def test_tracing_errors(text: str, error: str) -> None:
    errors = errors_of(text + "\n")
    assert len(errors) == 1, errors
    assert errors[0].startswith(error), errors


def test_max_pending_bounds_queues_of_the_config() -> None:
    config = parse("queues: {default: 1, bulk: 2}\nmax_pending: {bulk: 100000}\n")
    assert config.max_pending == {"bulk": 100000}
    assert parse("queues: {default: 1}\n").max_pending == {}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("max_pending: {other: 10}", "jobcar.yaml:1:15 max_pending.other: queue 'other' is not in queues"),
        ("max_pending: {default: 0}", "jobcar.yaml:1:24 max_pending.default: must be at least 1"),
        ("max_pending: {default: many}", "jobcar.yaml:1:24 max_pending.default: "),
        ("max_pending: [default]", "jobcar.yaml:1:14 max_pending: "),
    ],
)
def test_max_pending_errors(text: str, error: str) -> None:
    errors = errors_of(text + "\n")
    assert len(errors) == 1, errors
    assert errors[0].startswith(error), errors


def test_a_handlers_max_pending_bounds_its_type() -> None:
    config = parse(
        """\
        handlers:
          email: {url: "http://h/email", max_pending: 100}
          resize: {command: [resize], max_pending: "${BOUND}"}
          plain: {url: "http://h/plain", max_pending: ~}
          other: {command: [other]}
        """,
        {"BOUND": "7"},
    )
    bounds = {name: handler.max_pending for name, handler in config.handlers.items()}
    assert bounds == {"email": 100, "resize": 7, "plain": None, "other": None}


@pytest.mark.parametrize(
    ("text", "where", "error"),
    [
        ("  a: {url: 'http://h/', max_pending: 0}", "2:38", "must be at least 1, not 0"),
        ("  a:\n    command: [a]\n    max_pending: many", "4:18", "must be an integer, not 'many'"),
        ("  a: {command: [a], max_pending: -5}", "2:34", "must be at least 1, not -5"),
        ("  a: {url: 'http://h/', max_pending: [1]}", "2:38", "must be an integer, not a list"),
        ("  a: {url: 'http://h/', max_pending: 1.5}", "2:38", "must be an integer"),
        ("  a: {url: 'http://h/', max_pending: 3}\nqueues: {'t-*': 1}", "2:25",
         "queues names patterns only: no daemon would write this bound"),
    ],
)  # fmt: skip
def test_a_handlers_max_pending_errors(text: str, where: str, error: str) -> None:
    errors = errors_of("handlers:\n" + text + "\n")
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"jobcar.yaml:{where} handlers.a.max_pending: {error}"), errors


def test_handlers_inherit_defaults_and_a_partial_backoff_merges_over_them() -> None:
    config = parse(
        """\
        handlers:
          a: {url: "http://h/a", backoff: {base: 2s}}
          b: {command: [b], timeout: 3s}
        defaults:
          timeout: 20s
          max_attempts: 3
          max_retry_after: 5m
          backoff: {strategy: linear, max: 1m}
        """
    )
    a, b = config.handlers["a"], config.handlers["b"]
    assert a.backoff == Backoff(strategy=BackoffStrategy.LINEAR, base=2.0, max=60.0)
    assert (a.timeout, a.max_attempts, a.max_retry_after) == (20.0, 3, 300.0)
    assert b.backoff == Backoff(strategy=BackoffStrategy.LINEAR, base=1.0, max=60.0)
    assert (b.timeout, b.max_attempts) == (3.0, 3)


def test_values_are_read_from_their_text_not_from_yaml_type_guesses() -> None:
    config = parse(
        """\
        namespace: 123
        concurrency: "20"
        strict_priority: "on"
        handlers:
          resize: {command: [resize, --quality, 80, yes, 1.50]}
        """
    )
    assert config.namespace == "123"
    assert config.concurrency == 20
    assert config.strict_priority is True
    handler = config.handlers["resize"]
    assert isinstance(handler, CommandHandler)
    assert handler.command == ("resize", "--quality", "80", "yes", "1.50")


def test_merge_keys_share_settings_between_handlers() -> None:
    config = parse(
        """\
        handlers:
          email.welcome: &email
            url: http://app/jobs/welcome
            timeout: 10s
            headers: {Authorization: Bearer x}
          email.reset:
            <<: *email
            url: http://app/jobs/reset
        """
    )
    reset = config.handlers["email.reset"]
    assert isinstance(reset, HttpHandler)
    assert (reset.url, reset.timeout, reset.headers) == ("http://app/jobs/reset", 10.0, {"Authorization": "Bearer x"})


# -- interpolation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("plain", {}, "plain"),
        ("${A}", {"A": "x"}, "x"),
        ("${A}", {"A": ""}, ""),
        ("a-${A}-b", {"A": "x"}, "a-x-b"),
        ("${A}${B}", {"A": "1", "B": "2"}, "12"),
        ("${A:-fallback}", {}, "fallback"),
        ("${A:-fallback}", {"A": ""}, "fallback"),
        ("${A:-fallback}", {"A": "set"}, "set"),
        ("${A:-}", {}, ""),
        ("${A:-redis://h:6379/0}", {}, "redis://h:6379/0"),
        ("${A:?A is needed}", {"A": "set"}, "set"),
        ("$$", {}, "$"),
        ("pa$$word", {}, "pa$word"),
        ("$${A}", {"A": "x"}, "${A}"),
        ("$$$${A}", {}, "$${A}"),
        ("cost: $5 or $", {}, "cost: $5 or $"),
        ("${A}", {"A": "${B}"}, "${B}"),  # substituted values are not expanded again
    ],
)
def test_interpolation(text: str, environ: dict[str, str], expected: str) -> None:
    assert interpolate(text, environ) == expected


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("${A}", {}, "environment variable A is not set (write ${A:-default} for a default)"),
        ("${A:?set A to the app URL}", {}, "environment variable A is unset or empty: set A to the app URL"),
        ("${A:?set A to the app URL}", {"A": ""}, "environment variable A is unset or empty: set A to the app URL"),
        ("${A:?}", {}, "environment variable A is unset or empty"),
        ("x${A", {}, "unterminated '${' (missing '}'; write $$ for a literal $)"),
        ("${1A}", {}, "invalid reference '${1A}': use ${VAR}, ${VAR:-default} or ${VAR:?message}"),
        ("${A-x}", {}, "invalid reference '${A-x}': use ${VAR}, ${VAR:-default} or ${VAR:?message}"),
        ("${A:-${B}}", {}, "nested references are not supported: '${A:-${B}}'"),
        (
            "${A}/${B}",
            {},
            "environment variable A is not set (write ${A:-default} for a default); "
            "environment variable B is not set (write ${B:-default} for a default)",
        ),
    ],
)
def test_interpolation_errors(text: str, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        interpolate(text, environ)


def test_interpolation_happens_before_type_conversion() -> None:
    config = parse(
        """\
        concurrency: ${WORKERS:-20}
        lease: ${LEASE}
        strict_priority: ${STRICT}
        max_payload_bytes: ${MAX_PAYLOAD:-2MiB}
        api_token: ${TOKEN}
        handlers:
          a:
            url: ${APP_URL:?set APP_URL}/jobs/a
            headers: {Authorization: "Bearer ${APP_TOKEN}", X-Price: "$$5"}
        """,
        {"LEASE": "1m", "STRICT": "true", "TOKEN": "", "APP_URL": "http://app:8080", "APP_TOKEN": "t"},
    )
    assert (config.concurrency, config.lease, config.strict_priority) == (20, 60.0, True)
    assert config.max_payload_bytes == 2 * 1024 * 1024
    assert config.api_token is None  # empty after interpolation: not set
    handler = config.handlers["a"]
    assert isinstance(handler, HttpHandler)
    assert handler.url == "http://app:8080/jobs/a"
    assert handler.headers == {"Authorization": "Bearer t", "X-Price": "$5"}


# -- durations and sizes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("300ms", 0.3),
        ("30s", 30.0),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1m 30s", 90.0),
        ("1d2h3m4s5ms", 93784.005),
        ("30", 30.0),
        ("2.5", 2.5),
        ("0", 0.0),
        ("-0s", 0.0),
        (" 10s ", 10.0),
        (30, 30.0),
        (0.25, 0.25),
    ],
)
def test_durations(value: str | float, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10x", "invalid duration '10x': use seconds or a number with a unit: 500ms, 30s, 2m, 1h, 1d, or combined"),
        ("", "invalid duration ''"),
        ("s", "invalid duration 's'"),
        ("1M", "invalid duration '1M'"),
        ("1h-30m", "invalid duration '1h-30m'"),
        ("-1s", "duration must not be negative, got '-1s'"),
        ("-5", "duration must not be negative, got '-5'"),
        (-1, "duration must not be negative, got -1"),
        (math.inf, "invalid duration inf: must be a finite number of seconds"),
        (math.nan, "invalid duration nan: must be a finite number of seconds"),
        (True, "invalid duration True"),
        ("1e999", "duration '1e999' is too large"),
    ],
)
def test_bad_durations(value: str | float, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (512, 512),
        ("512", 512),
        ("512B", 512),
        ("10KB", 10_000),
        ("64KiB", 65_536),
        ("64 KiB", 65_536),
        ("64kib", 65_536),
        ("1MB", 1_000_000),
        ("1MiB", 1_048_576),
        ("1GB", 1_000_000_000),
        ("1GiB", 1_073_741_824),
        ("2TiB", 2 * 2**40),
        ("1.5KiB", 1536),
        ("0", 0),
    ],
)
def test_sizes(value: str | int, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1K", "invalid size '1K': use bytes or a number with a unit: 512, 64KiB, 1MiB, 1GiB, 10KB"),
        ("KiB", "invalid size 'KiB'"),
        ("", "invalid size ''"),
        ("1 MiB B", "invalid size '1 MiB B'"),
        ("1.1", "size '1.1' is not a whole number of bytes"),
        ("0.5B", "size '0.5B' is not a whole number of bytes"),
        ("-1KiB", "size must not be negative, got '-1KiB'"),
        (-1, "size must not be negative, got -1"),
        (True, "invalid size True"),
    ],
)
def test_bad_sizes(value: str | int, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_size(value)


# -- errors, each with file:line:col key.path -----------------------------------------------------------

_NAME_RULE = "use 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("namespce: x\n", "jobcar.yaml:1:1 namespce: unknown key (did you mean 'namespace'?)", id="typo"),
        pytest.param("colour: red\n", "jobcar.yaml:1:1 colour: unknown key", id="unknown-no-suggestion"),
        pytest.param(
            "redis:\n  ulr: redis://x\n",
            "jobcar.yaml:2:3 redis.ulr: unknown key (did you mean 'url'?)",
            id="nested-typo",
        ),
        pytest.param(
            "handlers:\n  email.welcome:\n    url: http://h/\n    timout: 10s\n",
            "jobcar.yaml:4:5 handlers.email.welcome.timout: unknown key (did you mean 'timeout'?)",
            id="handler-typo",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    env: {A: b}\n",
            "jobcar.yaml:4:5 handlers.a.env: only applies to command handlers (this one has a url)",
            id="command-key-on-http-handler",
        ),
        pytest.param(
            "handlers:\n  a:\n    command: [a]\n    headers: {A: b}\n",
            "jobcar.yaml:4:5 handlers.a.headers: only applies to HTTP handlers (this one has a command)",
            id="http-key-on-command-handler",
        ),
        pytest.param(
            "lease: 10s\nconcurrency: 2\nlease: 20s\n",
            "jobcar.yaml:3:1 lease: duplicate key (first defined on line 1)",
            id="duplicate",
        ),
        pytest.param(
            "handlers:\n  a: {url: 'http://h/', timeout: 1s, timeout: 2s}\n",
            "jobcar.yaml:2:38 handlers.a.timeout: duplicate key (first defined on line 2)",
            id="duplicate-in-flow-mapping",
        ),
        pytest.param("concurrency: many\n", "jobcar.yaml:1:14 concurrency: must be an integer, not 'many'", id="int"),
        pytest.param("concurrency: 0\n", "jobcar.yaml:1:14 concurrency: must be at least 1, not 0", id="int-min"),
        pytest.param("concurrency:\n", "jobcar.yaml:1:13 concurrency: must be an integer, not empty", id="int-null"),
        pytest.param(
            "concurrency: [1]\n", "jobcar.yaml:1:14 concurrency: must be an integer, not a list", id="int-list"
        ),
        pytest.param(
            "strict_priority: maybe\n", "jobcar.yaml:1:18 strict_priority: must be true or false, not 'maybe'"
        ),
        pytest.param(
            "lease: 30 seconds\n",
            "jobcar.yaml:1:8 lease: invalid duration '30 seconds': use seconds or a number with a unit: "
            "500ms, 30s, 2m, 1h, 1d, or combined like 1h30m",
            id="duration",
        ),
        pytest.param(
            "shutdown_timeout: -5s\n",
            "jobcar.yaml:1:19 shutdown_timeout: duration must not be negative, got '-5s'",
            id="negative-duration",
        ),
        pytest.param("lease: 500ms\n", "jobcar.yaml:1:8 lease: must be at least 1s, not '500ms'", id="lease-min"),
        pytest.param(
            "defaults:\n  timeout: 0s\n",
            "jobcar.yaml:2:12 defaults.timeout: must be more than 0s, not '0s'",
            id="timeout",
        ),
        pytest.param(
            "max_payload_bytes: 2 megabytes\n",
            "jobcar.yaml:1:20 max_payload_bytes: invalid size '2 megabytes': use bytes or a number with a unit: "
            "512, 64KiB, 1MiB, 1GiB, 10KB (KB = 1000, KiB = 1024)",
            id="size",
        ),
        pytest.param("max_payload_bytes: 0\n", "jobcar.yaml:1:20 max_payload_bytes: must be at least 1 byte, not '0'"),
        pytest.param("namespace: my app\n", f"jobcar.yaml:1:12 namespace: invalid name 'my app': {_NAME_RULE}"),
        pytest.param("queues: {.hidden: 1}\n", f"jobcar.yaml:1:10 queues..hidden: invalid queue name: {_NAME_RULE}"),
        pytest.param("queues:\n  low: 0\n", "jobcar.yaml:2:8 queues.low: must be at least 1, not 0", id="weight"),
        pytest.param("queues: {low: 1.5}\n", "jobcar.yaml:1:15 queues.low: must be an integer, not '1.5'"),
        pytest.param("queues: {}\n", "jobcar.yaml:1:9 queues: must name at least one queue, like {default: 1}"),
        pytest.param(
            "queues: [a, b]\n",
            "jobcar.yaml:1:9 queues: must be a mapping of queue names to weights, like {critical: 6, default: 3}, "
            "not a list",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    command: [a]\n",
            "jobcar.yaml:4:5 handlers.a: has both url and command: a handler is one or the other",
            id="url-and-command",
        ),
        pytest.param(
            "handlers:\n  a:\n    timeout: 1s\n",
            "jobcar.yaml:3:5 handlers.a: needs url (an HTTP handler) or command (a command handler)",
            id="neither",
        ),
        pytest.param(
            "handlers:\n  a: ~\n",
            "jobcar.yaml:2:6 handlers.a: needs url (an HTTP handler) or command (a command handler)",
            id="empty-handler",
        ),
        pytest.param(
            "handlers:\n  img:\n    command: resize --quality 80\n",
            "jobcar.yaml:3:14 handlers.img.command: must be an argv list, not a string: jobcar never runs a shell; "
            'write ["resize", "--quality", "80"]',
            id="command-string",
        ),
        pytest.param(
            "handlers:\n  img:\n    command: resize | gzip\n",
            "jobcar.yaml:3:14 handlers.img.command: must be an argv list, not a string: jobcar never runs a shell",
            id="command-shell-string",
        ),
        pytest.param(
            "handlers:\n  img:\n    command: []\n",
            "jobcar.yaml:3:14 handlers.img.command: must name the program to run, "
            "like [/usr/local/bin/resize, --quality, '80']",
            id="command-empty",
        ),
        pytest.param(
            "handlers:\n  img:\n    command: [resize, {a: 1}]\n",
            "jobcar.yaml:3:23 handlers.img.command[1]: must be a string, not a mapping",
            id="command-item",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: ftp://files/x\n",
            "jobcar.yaml:3:10 handlers.a.url: must be an http:// or https:// URL, not 'ftp://files/x'",
            id="url-scheme",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h:99999/\n",
            "jobcar.yaml:3:10 handlers.a.url: invalid URL 'http://h:99999/': Port out of range 0-65535",
            id="url-port",
        ),
        pytest.param(
            "handlers:\n  email welcome:\n    url: http://h/\n",
            "jobcar.yaml:2:3 handlers.email welcome: invalid job type name: use 1 to 200 letters, digits, "
            "'.', '_', ':' or '-', starting with a letter or digit",
            id="type-name",
        ),
        pytest.param(
            "defaults:\n  backoff: {strategy: fibonacci}\n",
            "jobcar.yaml:2:23 defaults.backoff.strategy: must be one of exponential, linear, constant, not 'fibonacci'",
            id="strategy",
        ),
        pytest.param(
            "handlers:\n  a:\n    command: [a]\n    permanent_exit_codes: [64, 0]\n",
            "jobcar.yaml:4:32 handlers.a.permanent_exit_codes[1]: must be from 1 to 255, not 0",
            id="exit-code",
        ),
        pytest.param(
            "handlers:\n  a:\n    command: [a]\n    permanent_exit_codes: 64\n",
            "jobcar.yaml:4:27 handlers.a.permanent_exit_codes: must be a list of exit codes, like [64, 65], not '64'",
            id="exit-codes-not-a-list",
        ),
        pytest.param(
            'handlers:\n  a:\n    url: http://h/\n    headers: {X-A: "a\\nb"}\n',
            "jobcar.yaml:4:20 handlers.a.headers.X-A: must not contain line breaks",
            id="header-injection",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {key: meta.tenant}\n",
            "jobcar.yaml:4:13 handlers.a.limits: needs concurrency or rate (fleet-wide, for the type), per_key or "
            "per_key_rate (for each key), or on_429",
            id="limits-empty",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {concurrency: 2, key: meta.tenant}\n",
            "jobcar.yaml:4:13 handlers.a.limits: has key but no per_key, per_key_rate, fair or on_429: key: the key "
            "only matters for a per-key limit",
            id="limits-key-without-per-key",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {fair: true, key: meta.tenant}\n",
            "jobcar.yaml:4:13 handlers.a.limits: has fair but no concurrency: keys take turns for the type's "
            "concurrency slots",
            id="limits-fair-without-concurrency",
        ),
        pytest.param(
            "handlers:\n  a:\n    command: [cat]\n    limits: {on_429: key}\n",
            "jobcar.yaml:4:13 handlers.a.limits: on_429 only applies to HTTP handlers: a command has no 429",
            id="limits-on-429-command",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {rate: 100/fortnight}\n",
            "jobcar.yaml:4:20 handlers.a.limits.rate: must be a count per period, like 100/s, 5/m or 3/500ms, "
            "not '100/fortnight'",
            id="limits-rate",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {rate: 5/2d}\n",
            "jobcar.yaml:4:20 handlers.a.limits.rate: must be from 1 per day to a million per second, with a period "
            "of 1ms to 1d, not '5/2d'",
            id="limits-rate-period",
        ),
        pytest.param(
            "concurrency: 10\nhandlers:\n  a:\n    url: http://h/\n    batch: {max_size: 11}\n",
            "jobcar.yaml:5:12 handlers.a.batch: max_size 11 is more than concurrency 10: every job of a forming batch "
            "is leased and holds one of the daemon's concurrency slots",
            id="batch-larger-than-concurrency",
        ),
        pytest.param(
            "concurrency: 5000\nhandlers:\n  a:\n    command: [cat]\n    batch: {max_size: 1001}\n",
            "jobcar.yaml:5:12 handlers.a.batch: max_size must be at most 1000, not 1001",
            id="batch-max-size",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    batch: {max_wait: 2m}\n",
            "jobcar.yaml:4:12 handlers.a.batch: max_wait must be at most 60s: a job holds its lease while it waits",
            id="batch-max-wait",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    batch: {key: tenant}\n",
            "jobcar.yaml:4:18 handlers.a.batch.key: must be key (the producer's key=), meta.<name> or "
            "payload.<field>, not 'tenant'",
            id="batch-key-source",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {concurrency: 1, burst: 3}\n",
            "jobcar.yaml:4:13 handlers.a.limits: has burst but no rate",
            id="limits-burst-without-rate",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {per_key: 2, key: headers.x}\n",
            "jobcar.yaml:4:31 handlers.a.limits.key: must be key (the producer's key=), meta.<name> or "
            "payload.<field>, not 'headers.x'",
            id="limits-key-source",
        ),
        pytest.param(
            "handlers:\n  a:\n    url: http://h/\n    limits: {per_key: 0}\n",
            "jobcar.yaml:4:23 handlers.a.limits.per_key: must be at least 1, not 0",
            id="limits-per-key",
        ),
        pytest.param(
            "listen: 9321\n",
            "jobcar.yaml:1:9 listen: must be host:port, like 127.0.0.1:9321 or [::1]:9321, not '9321'",
            id="listen",
        ),
        pytest.param(
            "listen: ::1:9321\n",
            "jobcar.yaml:1:9 listen: must be host:port with an IPv6 address in brackets, like [::1]:9321, "
            "not '::1:9321'",
            id="listen-ipv6",
        ),
        pytest.param(
            "listen: 'localhost:http'\n",
            "jobcar.yaml:1:9 listen: port must be a number from 0 to 65535, not 'http'",
            id="listen-port",
        ),
        *(
            pytest.param(
                f"api_allowed_hosts: [jobcar, '{entry}']\n",
                f"jobcar.yaml:1:29 api_allowed_hosts[1]: must be a host name like jobcar.internal, without a scheme "
                f"or a port, not {entry!r}",
                id=f"api-allowed-hosts-{entry}",
            )
            for entry in ("jobcar.internal:9321", "http://x", "*.example", "-x", "a..b")
        ),
        *(
            pytest.param(
                f"api_allowed_hosts: [jobcar, '{entry}']\n",
                f"jobcar.yaml:1:29 api_allowed_hosts[1]: {entry!r} is an IP address, which the API always answers "
                "to: list host names only",
                id=f"api-allowed-hosts-{entry}",
            )
            for entry in ("10.0.0.1", "[::1]", "::1")
        ),
        pytest.param(
            "api_allowed_hosts: jobcar.internal\n",
            "jobcar.yaml:1:20 api_allowed_hosts: must be a list of host names, like [jobcar.internal], "
            "not 'jobcar.internal'",
            id="api-allowed-hosts-not-a-list",
        ),
        pytest.param(
            "log_level: warn\n",
            "jobcar.yaml:1:12 log_level: must be one of debug, info, warning, error, not 'warn' "
            "(did you mean 'warning'?)",
        ),
        pytest.param(
            "log_format: text\n", "jobcar.yaml:1:13 log_format: must be one of auto, json, console, not 'text'"
        ),
        pytest.param("redis:\n  url: ''\n", "jobcar.yaml:2:8 redis.url: must not be empty", id="redis-url"),
        pytest.param(
            "redis:\n  url: ${REDIS_URL}\n",
            "jobcar.yaml:2:8 redis.url: environment variable REDIS_URL is not set "
            "(write ${REDIS_URL:-default} for a default)",
            id="undefined-variable",
        ),
        pytest.param(
            "api_token: ${TOKEN:?generate one with openssl rand -hex 32}\n",
            "jobcar.yaml:1:12 api_token: environment variable TOKEN is unset or empty: "
            "generate one with openssl rand -hex 32",
            id="required-variable",
        ),
        pytest.param("defaults: 5\n", "jobcar.yaml:1:11 defaults: must be a mapping, not '5'", id="section-type"),
        pytest.param("- a\n- b\n", "jobcar.yaml:1:1: the config must be a mapping of settings, not a list", id="top"),
        pytest.param(
            "lease: 30s\n  concurrency: 2\n",
            "jobcar.yaml:2:14: mapping values are not allowed here",
            id="yaml-syntax",
        ),
        pytest.param(
            "queues: {a: 1\n",
            "jobcar.yaml:2:1: expected ',' or '}', but got '<stream end>' (while parsing a flow mapping at line 1, "
            "column 9)",
            id="yaml-unclosed",
        ),
        pytest.param(
            "a: 1\n---\nb: 2\n",
            "jobcar.yaml:2:1: but found another document "
            "(expected a single document in the stream at line 1, column 1)",
            id="two-documents",
        ),
    ],
)
def test_each_error_names_file_line_column_and_key(text: str, error: str) -> None:
    assert errors_of(text) == [error]


def test_all_errors_are_reported_at_once_in_file_order() -> None:
    text = """\
        handlers:
          a:
            url: http://h/
            timout: 10s
        concurrency: 0
        lease: soon
        queues: {default: -1}
        namespace: ok
        colour: blue
        """
    errors = errors_of(text)
    assert errors == [
        "jobcar.yaml:4:5 handlers.a.timout: unknown key (did you mean 'timeout'?)",
        "jobcar.yaml:5:14 concurrency: must be at least 1, not 0",
        "jobcar.yaml:6:8 lease: invalid duration 'soon': use seconds or a number with a unit: "
        "500ms, 30s, 2m, 1h, 1d, or combined like 1h30m",
        "jobcar.yaml:7:19 queues.default: must be at least 1, not -1",
        "jobcar.yaml:9:1 colour: unknown key",
    ]
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert str(caught.value) == "\n".join(errors)


def test_an_error_inside_merged_settings_is_reported_once() -> None:
    text = """\
        handlers:
          a: &base
            url: http://h/a
            timeout: never
          b:
            <<: *base
            url: http://h/b
        """
    assert errors_of(text) == [
        "jobcar.yaml:4:14 handlers.a.timeout: invalid duration 'never': use seconds or a number with a unit: "
        "500ms, 30s, 2m, 1h, 1d, or combined like 1h30m",
        "jobcar.yaml:4:14 handlers.b.timeout: invalid duration 'never': use seconds or a number with a unit: "
        "500ms, 30s, 2m, 1h, 1d, or combined like 1h30m",
    ]


# -- files on disk --------------------------------------------------------------------------------------


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(FULL_EXAMPLE, encoding="utf-8")
    config = load_config(path, {"APP_TOKEN": "t"})
    assert config.source == str(path)
    assert set(config.handlers) == {"email.welcome", "image.resize"}


def test_load_config_uses_the_process_environment_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text("namespace: ${JOBCAR_TEST_NAMESPACE}\n", encoding="utf-8")
    monkeypatch.setenv("JOBCAR_TEST_NAMESPACE", "from-env")
    assert load_config(str(path)).namespace == "from-env"


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text("queues:\n  default: 1\n  bulk: none\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert caught.value.errors == [f"{path}:3:9 queues.bulk: must be an integer, not 'none'"]


def test_windows_line_endings_and_a_bom_keep_the_same_positions(tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_bytes(b"\xef\xbb\xbfnamespace: ok\r\nlease: x\r\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert caught.value.errors[0].startswith(f"{path}:2:8 lease: invalid duration 'x'")


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.errors == [f"{path}: no such file"]


def test_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert caught.value.errors == [f"{tmp_path}: cannot read: Is a directory"]


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_bytes(b"namespace: ok\nlease: \xff\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.errors == [f"{path}:2:8: not UTF-8 text (byte 0xff)"]


def test_control_characters_are_a_located_error() -> None:
    assert errors_of("namespace: ok\nlease: \x07\n") == [
        "jobcar.yaml:2:8: special characters are not allowed (character #x0007)"
    ]


# -- the loader's tables, the dataclasses and the JSON Schema agree ------------------------------------


def _field_names(cls: type, *, without: tuple[str, ...] = ()) -> set[str]:
    return {f.name for f in fields(cls)} - set(without)


def test_the_loader_accepts_exactly_the_dataclass_fields() -> None:
    # queue_patterns: the keys of `queues` that are patterns (ADR 0027), not a key of the file.
    assert set(KNOWN_KEYS[""]) == _field_names(Config, without=("source", "queue_patterns"))
    assert set(KNOWN_KEYS["redis"]) == _field_names(RedisSettings)
    assert set(KNOWN_KEYS["defaults"]) == _field_names(Defaults)
    assert set(KNOWN_KEYS["backoff"]) == _field_names(Backoff)
    assert set(KNOWN_KEYS["dead_letter"]) == _field_names(DeadLetter)
    assert set(KNOWN_KEYS["ui"]) == _field_names(UiSettings)
    assert set(KNOWN_KEYS["handler_api"]) == _field_names(HandlerApiSettings)
    assert set(KNOWN_KEYS["tracing"]) == _field_names(TracingSettings)
    assert set(KNOWN_KEYS["http handler"]) == _field_names(HttpHandler, without=("type",))
    assert set(KNOWN_KEYS["command handler"]) == _field_names(CommandHandler, without=("type",))
    assert set(KNOWN_KEYS["limits"]) == _field_names(Limits)


def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        node = schema["$defs"][name]
    return node


def _objects(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema object in the document that lists properties, with where it is."""
    if isinstance(node, dict):
        if "properties" in node:
            yield where, node
        for key, value in node.items():
            yield from _objects(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, f"{where}/{index}")


def _schema_sections(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The schema object of each section named in KNOWN_KEYS."""
    top = schema["properties"]
    handlers = [_resolve(schema, choice) for choice in top["handlers"]["additionalProperties"]["oneOf"]]
    (http,) = [h for h in handlers if h.get("required") == ["url"]]
    (command,) = [h for h in handlers if h.get("required") == ["command"]]
    defaults = _resolve(schema, top["defaults"])
    sections = {
        "": schema,
        "redis": _resolve(schema, top["redis"]),
        "defaults": defaults,
        "backoff": _resolve(schema, defaults["properties"]["backoff"]),
        "dead_letter": _resolve(schema, top["dead_letter"]),
        "ui": _resolve(schema, top["ui"]),
        "handler_api": _resolve(schema, top["handler_api"]),
        "tracing": _resolve(schema, top["tracing"]),
        "api token": _resolve(schema, top["api_tokens"]["additionalProperties"]),
        "http handler": http,
        "command handler": command,
        "schedule": _resolve(schema, top["schedules"]["additionalProperties"]),
        "limits": _resolve(schema, http["properties"]["limits"]),
        "batch": _resolve(schema, http["properties"]["batch"]),
    }
    for handler in (http, command):
        assert _resolve(schema, handler["properties"]["backoff"]) is sections["backoff"]
        assert _resolve(schema, handler["properties"]["limits"]) is sections["limits"]
    return sections


def test_the_schema_has_the_same_keys_as_the_loader_at_every_level() -> None:
    schema = _schema()
    sections = _schema_sections(schema)
    assert set(sections) == set(KNOWN_KEYS)
    for name, keys in KNOWN_KEYS.items():
        assert set(sections[name]["properties"]) == set(keys), f"section {name!r} of the schema drifted"
    # ...and the schema has no object with properties that the loader does not know.
    section_ids = {id(section) for section in sections.values()}
    strays = [where for where, node in _objects(schema) if id(node) not in section_ids]
    assert strays == []


def test_every_schema_object_is_closed_and_every_key_is_described() -> None:
    schema = _schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    for where, node in _objects(schema):
        assert node.get("additionalProperties") is False, where
        for key, prop in node["properties"].items():
            assert prop.get("description"), f"{where}/properties/{key} has no description"


def test_the_schema_defaults_are_the_loader_defaults() -> None:
    schema = _schema()
    sections = _schema_sections(schema)

    def defaults_of(section: str) -> dict[str, Any]:
        return {k: v["default"] for k, v in sections[section]["properties"].items() if "default" in v}

    top = defaults_of("")
    top["redis"] = defaults_of("redis")
    top["defaults"] = {**defaults_of("defaults"), "backoff": defaults_of("backoff")}
    top["dead_letter"] = defaults_of("dead_letter")
    top["handlers"] = {
        "h": {"url": "http://h/", **defaults_of("http handler")},
        "c": {"command": ["c"], **defaults_of("command handler")},
    }
    # JSON is YAML: the defaults, written out, must load to the dataclasses' own defaults.
    config = parse(json.dumps(top))
    inherited: dict[str, Any] = {
        "timeout": Defaults().timeout,
        "max_attempts": Defaults().max_attempts,
        "backoff": Backoff(),
        "max_retry_after": Defaults().max_retry_after,
    }
    assert config == Config(
        source="jobcar.yaml",
        handlers={
            "h": HttpHandler(type="h", url="http://h/", **inherited),
            "c": CommandHandler(type="c", command=("c",), **inherited),
        },
    )


def test_the_schema_patterns_accept_what_the_loader_accepts() -> None:
    defs = _schema()["$defs"]
    duration = re.compile(defs["duration"]["anyOf"][1]["pattern"])
    size = re.compile(defs["size"]["anyOf"][1]["pattern"])
    for text in ("500ms", "30s", "2m", "1h", "1d", "1h30m", "1m 30s", "1.5s", "30", "2.5"):
        assert duration.search(text), text
        parse_duration(text)
    for text in ("10x", "1M", "s", "-1s", "30 seconds"):
        assert not duration.search(text), text
    for text in ("512", "512B", "64KiB", "64 KiB", "1MiB", "1GiB", "10KB", "2TiB", "64kib"):
        assert size.search(text), text
        parse_size(text)
    for text in ("1K", "KiB", "-1KiB", "2 megabytes"):
        assert not size.search(text), text


def test_queue_patterns_are_kept_apart_from_the_queue_names_in_the_files_order() -> None:
    config = parse("queues: {critical: 6, 'tenant-*': 2, 'batch-?': 3}\n")
    assert config.queues == {"critical": 6}
    assert config.queue_patterns == {"tenant-*": 2, "batch-?": 3}
    only = parse("queues: {'*': 1}\n")
    assert (only.queues, only.queue_patterns) == ({}, {"*": 1})
    assert parse("queues: {default: 1}\n").queue_patterns == {}


def test_the_schemas_queue_pattern_is_the_loaders() -> None:
    schema = re.compile(_schema()["$defs"]["queuePattern"]["pattern"])
    for text in ("tenant-*", "*", "a?b", "*.eu", "?x", "tenant", "-*", "tenant-[ab]", "a b*", "x" * 100 + "*"):
        assert bool(schema.search(text)) == bool(QUEUE_PATTERN.fullmatch(text)), text


def test_a_queue_a_pattern_matches_is_a_known_queue_for_strict_enqueue() -> None:
    targets = parse("queues: {default: 1, 'tenant-*': 1}\nstrict_enqueue: true\n").known_targets()
    assert targets.problems([("t", "tenant-42")]) == [
        "jobcar.yaml has no handler for type 't'"
    ]  # the type only: the queue is served
    assert any("queue 'other' is not in the queues" in p for p in targets.problems([("t", "other")]))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("queues: {'tenant-[ab]': 1}", "jobcar.yaml:1:10 queues.tenant-[ab]: invalid queue pattern: a pattern uses"),
        ("queues: {'-*': 1}", "jobcar.yaml:1:10 queues.-*: invalid queue pattern"),
        ("queues: {'tenant-*': 0}", "jobcar.yaml:1:22 queues.tenant-*: must be at least 1"),
        ("queues: {'a b': 1}", "jobcar.yaml:1:10 queues.a b: invalid queue name: use 1 to 100"),
        ("queues: {'tenant-*': 1}\nmax_pending: {'tenant-*': 10}", "jobcar.yaml:2:15 max_pending.tenant-*: queue"),
    ],
)
def test_queue_pattern_errors_name_the_file_line_and_key(text: str, error: str) -> None:
    errors = errors_of(text + "\n")
    assert len(errors) == 1, errors
    assert errors[0].startswith(error), errors
