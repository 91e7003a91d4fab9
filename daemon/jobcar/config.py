"""Load the YAML config file into the frozen dataclasses of `config_types`.

The file is composed into PyYAML's node tree instead of being constructed into Python objects, so every
value keeps its line and column: each problem is reported as `file:line:col key.path: message`, all of
them at once, so that one `jobcar check` lists everything there is to fix. `yaml_reader` walks the nodes;
this module, `config_settings` and the sections' modules (`config_handlers`, `config_limits`,
`config_schedules`) say what each key accepts. Each scalar is interpolated from the environment (`${VAR}`,
`${VAR:-default}`, `${VAR:?message}`, `$$`) before it is converted, so `concurrency: ${WORKERS:-20}`
works; durations ("30s") and sizes ("1MiB") are normalised here; unknown keys are rejected, because in a
config file they are nearly always typos.

Values are read from their text, not from YAML's guess at their type: `namespace: 123` is the string
"123", `command: [resize, --quality, 80]` passes "80", and `concurrency: "20"` is the integer 20.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from jobcar.config_handlers import (
    BACKOFF_FIELDS,
    COMMAND_FIELDS,
    DEFAULTS_FIELDS,
    HEADERS,
    HTTP_FIELDS,
    defaults_section,
    handlers_section,
)
from jobcar.config_limits import BATCH_FIELDS, LIMITS_FIELDS
from jobcar.config_schedules import SCHEDULE_FIELDS, schedules_section
from jobcar.config_settings import (
    API_TOKEN_FIELDS,
    DEAD_LETTER_FIELDS,
    HANDLER_API_FIELDS,
    LOG_FORMATS,
    LOG_LEVELS,
    REDIS_FIELDS,
    UI_FIELDS,
    api_tokens,
    host_names,
    listen,
    max_pending,
    optional_url,
    queues,
    ratio,
    redis_section,
    section,
    trace_url,
    valid_name,
)
from jobcar.config_types import (
    LEGACY_TOKEN_NAME,
    Config,
    DeadLetter,
    Defaults,
    HandlerApiSettings,
    TracingSettings,
    UiSettings,
)
from jobcar.config_values import boolean, choice, duration, integer, optional_string, size, string
from jobcar.errors import JobcarError
from jobcar.listen import exposure_problem
from jobcar.names import is_queue_pattern
from jobcar.yaml_reader import Converter, Entry, Invalid, KeyPath, Reader, line_col, syntax_error

__all__ = ["KNOWN_KEYS", "ConfigError", "load_config", "parse_config"]


class ConfigError(JobcarError):
    """The config cannot be used. `errors` holds every problem found, each one line naming its place."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def load_config(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *, secrets_needed: bool = True
) -> Config:
    """Read and validate the config file at `path`, interpolating from `environ` (default `os.environ`).
    `secrets_needed=False` for a command that runs no handler: handlers' secrets may then be unset."""
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{source}: no such file"]) from None
    except OSError as exc:
        raise ConfigError([f"{source}: cannot read: {exc.strerror or exc}"]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = line_col(data[: exc.start].decode("utf-8", "replace"), exc.start)
        raise ConfigError([f"{source}:{line}:{col}: not UTF-8 text (byte 0x{data[exc.start]:02x})"]) from None
    # Same newline handling as text mode, so that \r\n files report the same columns.
    text = text.replace("\r\n", "\n")
    return parse_config(text, source, os.environ if environ is None else environ, secrets_needed=secrets_needed)


def parse_config(text: str, source: str, environ: Mapping[str, str], *, secrets_needed: bool = True) -> Config:
    """Validate the YAML `text` (read from `source`, named in messages) into a Config, or raise ConfigError."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError([syntax_error(source, exc)]) from None
    except yaml.reader.ReaderError as exc:
        line, col = line_col(text, exc.position)
        raise ConfigError([f"{source}:{line}:{col}: {exc.reason} (character #x{exc.character:04x})"]) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError([f"{source}: not a usable YAML file: {exc}"]) from None
    reader = Reader(source, environ, secrets_needed=secrets_needed)
    values = _top_level(reader, root) if root is not None else {}
    if reader.problems:
        raise ConfigError(reader.messages())
    return Config(source=source, **values)


#: The `tracing` section: one exporter (endpoint, headers) for the spans and the pushed metrics (tracing.py).
TRACING_FIELDS: Final[Mapping[str, Converter]] = {
    "enabled": boolean,
    "endpoint": optional_url,
    "headers": HEADERS,
    "service_name": string,
    "sampling_ratio": ratio,
    "metrics_interval": duration(),
    "trace_url": trace_url,
}


def _tracing_section(r: Reader, node: yaml.Node, path: KeyPath) -> TracingSettings:
    values = r.fields(r.entries(node, path, TRACING_FIELDS), path, TRACING_FIELDS)
    if values.get("endpoint", "") is None:
        del values["endpoint"]  # null or "" (e.g. ${OTLP_ENDPOINT:-}): the default, like an absent key
    return TracingSettings(**values)


_TOP_FIELDS: Final[Mapping[str, Converter]] = {
    "redis": redis_section,
    "namespace": valid_name,
    "queues": queues,
    "strict_priority": boolean,
    "concurrency": integer(1),
    "lease": duration(1.0),
    "shutdown_timeout": duration(),
    "listen": listen,
    "api_token": optional_string,
    "api_allowed_hosts": host_names,
    "api_tokens": api_tokens,
    "health_url": optional_url,
    "log_level": choice(LOG_LEVELS),
    "log_format": choice(LOG_FORMATS),
    "result_ttl": duration(),
    "max_payload_bytes": size(1),
    "defaults": defaults_section,
    "dead_letter": section(DeadLetter, DEAD_LETTER_FIELDS),
    "schedules": schedules_section,
    "ui": section(UiSettings, UI_FIELDS),
    "handler_api": section(HandlerApiSettings, HANDLER_API_FIELDS),
    "tracing": _tracing_section,
    "history": boolean,
    "strict_enqueue": boolean,
    "max_pending": max_pending,
}

#: The keys the loader accepts in each part of the file (the JSON Schema in config/schema.json must match).
KNOWN_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "": (*_TOP_FIELDS, "handlers"),
    "redis": tuple(REDIS_FIELDS),
    "defaults": tuple(DEFAULTS_FIELDS),
    "backoff": tuple(BACKOFF_FIELDS),
    "dead_letter": tuple(DEAD_LETTER_FIELDS),
    "ui": tuple(UI_FIELDS),
    "handler_api": tuple(HANDLER_API_FIELDS),
    "api token": tuple(API_TOKEN_FIELDS),
    "tracing": tuple(TRACING_FIELDS),
    "http handler": tuple(HTTP_FIELDS),
    "command handler": tuple(COMMAND_FIELDS),
    "schedule": tuple(SCHEDULE_FIELDS),
    "limits": tuple(LIMITS_FIELDS),
    "batch": tuple(BATCH_FIELDS),
}


def _top_level(r: Reader, root: yaml.Node) -> dict[str, Any]:
    try:
        entries = r.entries(root, (), KNOWN_KEYS[""], what="a mapping of settings")
    except Invalid as exc:
        r.error(root, (), "the config " + exc.message)
        return {}
    values = r.fields(entries, (), _TOP_FIELDS)
    if "queues" in values:  # the patterns apart (ADR 0027): every reader of `queues` keeps seeing names only
        values["queue_patterns"] = {q: w for q, w in values["queues"].items() if is_queue_pattern(q)}
        values["queues"] = {q: w for q, w in values["queues"].items() if not is_queue_pattern(q)}
    if "listen" in values:
        # `jobcar run` refuses the same (api.check_exposure), so `jobcar check` says it first.
        problem = exposure_problem(values["listen"], bool(values.get("api_token") or values.get("api_tokens")))
        if problem is not None:
            r.error(entries["listen"].value, ("listen",), problem.removeprefix(f"listen {values['listen']} "))
    _check_api_tokens(r, entries, values)
    for spec in values.get("schedules", ()):
        if spec.queue not in values.get("queues", {"default": 1}):
            node = r.entries(entries["schedules"].value, ("schedules",))[spec.name].value
            r.error(node, ("schedules", spec.name), f"queue {spec.queue!r} is not in queues: no daemon would fire it")
    for queue in values.get("max_pending", {}):
        if queue not in values.get("queues", {"default": 1}):
            node = r.entries(entries["max_pending"].value, ("max_pending",))[queue].key
            r.error(node, ("max_pending", queue), f"queue {queue!r} is not in queues: no daemon would write its bound")
    if "handlers" in entries:
        # Handlers need the defaults, so they are read after every other key, wherever they stand in the file.
        node = entries["handlers"].value
        try:
            values["handlers"] = handlers_section(r, node, ("handlers",), values.get("defaults", Defaults()))
        except Invalid as exc:
            r.error(node, ("handlers",), exc.message)
        _check_batch_sizes(r, node, values)
        _check_type_bounds(r, node, values)
    return values


def _check_api_tokens(r: Reader, entries: Mapping[str, Entry], values: dict[str, Any]) -> None:
    """Each token names one caller: no two names share a token, and `api_token` keeps its name."""
    named = values.get("api_tokens", ())
    seen: dict[str, str] = {LEGACY_TOKEN_NAME: values["api_token"]} if values.get("api_token") else {}
    for setting in named:
        where = ("api_tokens", setting.name)
        node = r.entries(entries["api_tokens"].value, where[:1])[setting.name].key
        if setting.name == LEGACY_TOKEN_NAME and LEGACY_TOKEN_NAME in seen:
            r.error(node, where, "api_token is the name of the api_token setting's token: choose another")
            continue
        same = next((name for name, token in seen.items() if setting.token and token == setting.token), None)
        if same is not None:
            r.error(node, where, f"the same token as {same}: give each name its own token")
        elif setting.token:
            seen[setting.name] = setting.token


def _check_type_bounds(r: Reader, handlers_node: yaml.Node, values: dict[str, Any]) -> None:
    """A type's bound is written to the literal queues of `queues` (queue_settings.py): with patterns only, none."""
    if values.get("queues", {"default": 1}):
        return
    for name, handler in values.get("handlers", {}).items():
        if handler.max_pending is not None:
            path = ("handlers", name, "max_pending")
            node = r.entries(r.entries(handlers_node, path[:1])[name].value, path[:2])["max_pending"].key
            r.error(node, path, "queues names patterns only: no daemon would write this bound (name a queue)")


def _check_batch_sizes(r: Reader, handlers_node: yaml.Node, values: dict[str, Any]) -> None:
    """Each job of a forming batch holds one of the daemon's `concurrency` slots: a batch larger than that
    could never fill, and would only ever be sent on its max_wait."""
    concurrency = values.get("concurrency", Config(source="").concurrency)
    for name, handler in values.get("handlers", {}).items():
        if handler.batch is not None and handler.batch.max_size > concurrency:
            path = ("handlers", name, "batch")
            node = r.entries(r.entries(handlers_node, path[:1])[name].value, path[:2])["batch"].value
            message = (f"max_size {handler.batch.max_size} is more than concurrency {concurrency}: every job of a "
                       "forming batch is leased and holds one of the daemon's concurrency slots")  # fmt: skip
            r.error(node, path, message)
