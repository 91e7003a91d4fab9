"""Load the YAML config file into the frozen dataclasses of `config_types`.

The file is composed into PyYAML's node tree instead of being constructed into Python objects, so every
value keeps its line and column: each problem is reported as `file:line:col key.path: message`, all of
them at once, so that one `jobcar check` lists everything there is to fix. `yaml_reader` walks the nodes;
this module says what each key accepts. Each scalar is interpolated from the environment (`${VAR}`,
`${VAR:-default}`, `${VAR:?message}`, `$$`) before it is converted, so `concurrency: ${WORKERS:-20}`
works; durations ("30s") and sizes ("1MiB") are normalised here; unknown keys are rejected, because in a
config file they are nearly always typos.

Values are read from their text, not from YAML's guess at their type: `namespace: 123` is the string
"123", `command: [resize, --quality, 80]` passes "80", and `concurrency: "20"` is the integer 20.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import yaml

from jobcar.browser_guard import HOST_NAME, is_ip_address
from jobcar.config_types import (
    Backoff,
    BackoffStrategy,
    BatchDelivery,
    CommandHandler,
    Config,
    DeadLetter,
    Defaults,
    Handler,
    HttpHandler,
    Limits,
    Rate,
    RedisSettings,
    UiSettings,
)
from jobcar.config_values import boolean, choice, duration, integer, optional_string, parse_int, size, string
from jobcar.errors import InvalidJob, JobcarError
from jobcar.listen import exposure_problem, parse_listen
from jobcar.names import NAME_PATTERN, NAME_RULE, TYPE_PATTERN, TYPE_RULE
from jobcar.options import OPTIONS, SCHEDULE_OPTIONS, Kind, Option
from jobcar.redis_url import is_sentinel_url, redis_url_problem
from jobcar.schedules import CATCHUP, OVERLAP, ScheduleSpec, make_spec
from jobcar.units import parse_duration
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader, is_null, line_col, syntax_error

__all__ = ["KNOWN_KEYS", "ConfigError", "load_config", "parse_config"]

_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
_ENV_NAME: Final = re.compile(r"[^=\0]+")
_LOG_LEVELS: Final = ("debug", "info", "warning", "error")
_LOG_FORMATS: Final = ("auto", "json", "console")

_T = TypeVar("_T")


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


# -- scalar converters --------------------------------------------------------------------------------


_strategy_name: Final = choice(tuple(strategy.value for strategy in BackoffStrategy))


def _strategy(r: Reader, node: yaml.Node, path: KeyPath) -> BackoffStrategy:
    return BackoffStrategy(_strategy_name(r, node, path))


def _name(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "a name")
    if not NAME_PATTERN.fullmatch(text):
        raise Invalid(f"invalid name {text!r}: {NAME_RULE}")
    return text


def _check_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise Invalid(f"invalid URL {text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"\s", text):
        raise Invalid(f"must be an http:// or https:// URL, not {text!r}")
    return text


def _optional_secret(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    return r.secret(node, "a string") or None


def _redis_url(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = string(r, node, path)
    problem = redis_url_problem(text)
    if problem is not None:
        raise Invalid(problem)
    return text


def _url(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    return _check_url(r.text(node, "a URL"))


def _optional_url(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    text = r.scalar(node, "a URL")
    return _check_url(text) if text else None


def _listen(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "host:port")
    try:
        parse_listen(text)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    return text


# -- collection converters ----------------------------------------------------------------------------


def _queues(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, int]:
    entries = r.entries(node, path, what="a mapping of queue names to weights, like {critical: 6, default: 3}")
    if not entries:
        raise Invalid("must name at least one queue, like {default: 1}")
    weights: dict[str, int] = {}
    for name, entry in entries.items():
        if not NAME_PATTERN.fullmatch(name):
            r.error(entry.key, (*path, name), f"invalid queue name: {NAME_RULE}")
        try:
            weights[name] = parse_int(r.text(entry.value, "a weight (a positive integer)"), 1)
        except Invalid as exc:
            r.error(entry.value, (*path, name), exc.message)
    return weights


def _secret_map(key: re.Pattern[str], key_rule: str, forbidden: str, forbidden_rule: str) -> Converter:
    """A mapping of names to values only a handler uses (headers, environment): see Reader.secret."""

    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, str]:
        result: dict[str, str] = {}
        for name, entry in r.entries(node, path).items():
            if not key.fullmatch(name):
                r.error(entry.key, (*path, name), f"invalid name: {key_rule}")
            try:
                value = r.secret(entry.value, "a string")
                if value is None:
                    raise Invalid("must be a string, not empty")
                if any(char in value for char in forbidden):
                    raise Invalid(forbidden_rule)
                result[name] = value
            except Invalid as exc:
                r.error(entry.value, (*path, name), exc.message)
        return result

    return convert


_headers: Final = _secret_map(_HEADER_NAME, "not a valid HTTP header name", "\r\n\0", "must not contain line breaks")
_env: Final = _secret_map(_ENV_NAME, "must not be empty or contain '='", "\0", "must not contain NUL characters")


def _items(r: Reader, node: yaml.Node, path: KeyPath, what: str, convert: Callable[[str], _T]) -> list[_T] | None:
    """Each scalar of a list, converted; None when any of them was reported."""
    items: list[_T] = []
    ok = True
    for index, item in enumerate(r.sequence(node, what)):
        try:
            items.append(convert(r.text(item, "a string")))
        except Invalid as exc:
            r.error(item, (*path, f"[{index}]"), exc.message)
            ok = False
    return items if ok else None


def _arg(text: str) -> str:
    if "\0" in text:
        raise Invalid("must not contain NUL characters")
    return text


def _argv(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[str, ...]:
    if isinstance(node, yaml.ScalarNode) and not is_null(node):
        message = "must be an argv list, not a string: jobcar never runs a shell"
        try:
            words = shlex.split(str(node.value))
        except ValueError:
            words = []
        if words and not any(set(word) & set("|&;<>()$`*?") for word in words):
            message += f"; write {json.dumps(words)}"
        raise Invalid(message)
    args = _items(r, node, path, "an argv list like [/usr/local/bin/resize, --quality, '80']", _arg)
    if args is not None and (not args or not args[0]):
        raise Invalid("must name the program to run, like [/usr/local/bin/resize, --quality, '80']")
    return tuple(args or ())


def _host_name(text: str) -> str:
    name = text.lower()
    if is_ip_address(name.strip("[]")):
        raise Invalid(f"{text!r} is an IP address, which the API always answers to: list host names only")
    if not HOST_NAME.fullmatch(name):
        raise Invalid(f"must be a host name like jobcar.internal, without a scheme or a port, not {text!r}")
    return name


def _host_names(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[str, ...]:
    return tuple(_items(r, node, path, "a list of host names, like [jobcar.internal]", _host_name) or ())


def _env_name(text: str) -> str:
    if not _ENV_NAME.fullmatch(text):
        raise Invalid(f"invalid environment variable name {text!r}")
    return text


def _env_allow(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[str, ...]:
    return tuple(_items(r, node, path, "a list of environment variable names", _env_name) or ())


def _exit_codes(r: Reader, node: yaml.Node, path: KeyPath) -> frozenset[int]:
    codes = _items(r, node, path, "a list of exit codes, like [64, 65]", lambda text: parse_int(text, 1, 255))
    return frozenset(codes or ())


# -- sections -----------------------------------------------------------------------------------------

_BACKOFF_FIELDS: Final[Mapping[str, Converter]] = {
    "strategy": _strategy,
    "base": duration(),
    "max": duration(),
}


def _backoff(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, Any]:
    """Only the keys given: a handler's `backoff: {base: 2s}` is merged over the defaults' backoff."""
    return r.fields(r.entries(node, path, _BACKOFF_FIELDS), path, _BACKOFF_FIELDS)


_DEFAULTS_FIELDS: Final[Mapping[str, Converter]] = {
    "timeout": duration(0.0, exclusive=True),
    "max_attempts": integer(1),
    "backoff": _backoff,
    "max_retry_after": duration(),
}


def _defaults(r: Reader, node: yaml.Node, path: KeyPath) -> Defaults:
    values = r.fields(r.entries(node, path, _DEFAULTS_FIELDS), path, _DEFAULTS_FIELDS)
    return Defaults(**{**values, "backoff": Backoff(**values.get("backoff", {}))})


def _section(cls: Callable[..., Any], table: Mapping[str, Converter]) -> Converter:
    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> Any:
        return cls(**r.fields(r.entries(node, path, table), path, table))

    return convert


_REDIS_FIELDS: Final[Mapping[str, Converter]] = {
    "url": _redis_url,
    "cluster": boolean,
    "strict": boolean,
    "data_dir": string,
}


def _redis(r: Reader, node: yaml.Node, path: KeyPath) -> RedisSettings:
    settings: RedisSettings = _section(RedisSettings, _REDIS_FIELDS)(r, node, path)
    if settings.cluster and is_sentinel_url(settings.url):
        # `jobcar run` could not connect so either: redis-py finds a Cluster's nodes itself, never through Sentinel.
        raise Invalid("cluster is true but url is a Sentinel URL: a Redis Cluster is reached through a node's URL")
    return settings


_DEAD_LETTER_FIELDS: Final[Mapping[str, Converter]] = {
    "max_jobs": integer(1),
    "max_age": duration(0.0, exclusive=True),
}

_UI_FIELDS: Final[Mapping[str, Converter]] = {
    "enabled": boolean,
    "write": boolean,
}

#: Where a per-key limit reads a job's key: the producer's key=, a meta entry or a payload field.
_LIMIT_KEY: Final = re.compile(r"key|meta\.[A-Za-z0-9_.:-]{1,100}|payload\.[A-Za-z0-9_-]{1,100}")


def _limit_key(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "a key source")
    if not _LIMIT_KEY.fullmatch(text):
        raise Invalid(f"must be key (the producer's key=), meta.<name> or payload.<field>, not {text!r}")
    return text


_RATE: Final = re.compile(r"\s*([0-9][0-9_]*)\s*/\s*(\S+)\s*")


def _rate(r: Reader, node: yaml.Node, path: KeyPath) -> Rate:
    """`<count>/<period>`: 100/s, 5/m, 1000/1h, 3/500ms."""
    text = r.text(node, "a rate")
    match = _RATE.fullmatch(text)
    try:
        if not match:
            raise ValueError
        count = parse_int(match[1], 1)
        unit = match[2]
        period = parse_duration(f"1{unit}" if unit.isalpha() else unit)
    except (ValueError, Invalid):
        raise Invalid(f"must be a count per period, like 100/s, 5/m or 3/500ms, not {text!r}") from None
    if not 0.001 <= period <= 86400 or count / period > 1_000_000:
        raise Invalid(f"must be from 1 per day to a million per second, with a period of 1ms to 1d, not {text!r}")
    return Rate(count, period)


_LIMITS_FIELDS: Final[Mapping[str, Converter]] = {
    "concurrency": integer(1),
    "per_key": integer(1),
    "rate": _rate,
    "burst": integer(1),
    "per_key_rate": _rate,
    "per_key_burst": integer(1),
    "fair": boolean,
    "on_429": choice(("job", "type", "key")),
    "key": _limit_key,
}


def _limits(r: Reader, node: yaml.Node, path: KeyPath) -> Limits:
    reported = len(r.problems)
    values = r.fields(r.entries(node, path, _LIMITS_FIELDS), path, _LIMITS_FIELDS)
    if len(r.problems) > reported:
        return Limits()  # the config is rejected anyway; a missing value was reported as wrong, not absent
    if not values.keys() & {"concurrency", "per_key", "rate", "per_key_rate", "on_429", "fair"}:
        raise Invalid("needs concurrency or rate (fleet-wide, for the type), per_key or per_key_rate (for each key), "
                      "or on_429")  # fmt: skip
    if values.get("fair") and "concurrency" not in values:
        raise Invalid("has fair but no concurrency: keys take turns for the type's concurrency slots")
    keyed = values.keys() & {"per_key", "per_key_rate"} or values.get("on_429") == "key" or values.get("fair")
    if "key" in values and not keyed:
        raise Invalid("has key but no per_key, per_key_rate, fair or on_429: key: the key only matters for a per-key "
                      "limit")  # fmt: skip
    for burst, rate in (("burst", "rate"), ("per_key_burst", "per_key_rate")):
        if burst in values and rate not in values:
            raise Invalid(f"has {burst} but no {rate}")
    limits: Limits = Limits(**values)
    return limits


_BATCH_FIELDS: Final[Mapping[str, Converter]] = {
    "max_size": integer(1),
    "max_wait": duration(),
    "key": _limit_key,
}
#: Bounds a batch's request body and a command's stdin; larger batches gain nothing measurable.
MAX_BATCH_SIZE: Final = 1000
#: The longest a job may wait for its batch to fill: it holds its lease meanwhile.
MAX_BATCH_WAIT: Final = 60.0


def _batch(r: Reader, node: yaml.Node, path: KeyPath) -> BatchDelivery:
    reported = len(r.problems)
    values = r.fields(r.entries(node, path, _BATCH_FIELDS), path, _BATCH_FIELDS)
    if len(r.problems) > reported:
        return BatchDelivery()  # the config is rejected anyway
    if values.get("max_size", 0) > MAX_BATCH_SIZE:
        raise Invalid(f"max_size must be at most {MAX_BATCH_SIZE}, not {values['max_size']}")
    if values.get("max_wait", 0) > MAX_BATCH_WAIT:
        raise Invalid(f"max_wait must be at most {MAX_BATCH_WAIT:g}s: a job holds its lease while it waits")
    batch: BatchDelivery = BatchDelivery(**values)
    return batch


_HANDLER_FIELDS: Final[Mapping[str, Converter]] = {
    **_DEFAULTS_FIELDS,
    "concurrency": integer(1, optional=True),
    "limits": _limits,
    "batch": _batch,
}
_HTTP_FIELDS: Final[Mapping[str, Converter]] = {
    "url": _url,
    **_HANDLER_FIELDS,
    "headers": _headers,
    "signing_secret": _optional_secret,
    "max_response_bytes": size(),
}
_COMMAND_FIELDS: Final[Mapping[str, Converter]] = {
    "command": _argv,
    **_HANDLER_FIELDS,
    "env": _env,
    "env_allow": _env_allow,
    "permanent_exit_codes": _exit_codes,
    "kill_grace": duration(),
    "max_output_bytes": size(),
    "cwd": optional_string,
}
_HTTP_ONLY: Final = {
    key: "only applies to HTTP handlers (this one has a command)" for key in _HTTP_FIELDS.keys() - _COMMAND_FIELDS
}
_COMMAND_ONLY: Final = {
    key: "only applies to command handlers (this one has a url)" for key in _COMMAND_FIELDS.keys() - _HTTP_FIELDS
}


def _handler(r: Reader, node: yaml.Node, path: KeyPath, name: str, defaults: Defaults) -> Handler | None:
    entries = r.entries(node, path, what="a mapping with url (an HTTP handler) or command (a command handler)")
    if "url" in entries and "command" in entries:
        r.error(entries["command"].key, path, "has both url and command: a handler is one or the other")
        r.reject_unknown(entries, path, {**_HTTP_FIELDS, **_COMMAND_FIELDS})
    elif "url" not in entries and "command" not in entries:
        r.error(node, path, "needs url (an HTTP handler) or command (a command handler)")
        r.reject_unknown(entries, path, {**_HTTP_FIELDS, **_COMMAND_FIELDS})
    elif "url" in entries:
        r.reject_unknown(entries, path, _HTTP_FIELDS, _COMMAND_ONLY)
    else:
        r.reject_unknown(entries, path, _COMMAND_FIELDS, _HTTP_ONLY)
    cls, table = (HttpHandler, _HTTP_FIELDS) if "url" in entries else (CommandHandler, _COMMAND_FIELDS)
    values = r.fields(entries, path, table)
    limits = values.get("limits")
    if cls is CommandHandler and limits is not None and limits.on_429 != "job":
        message = "on_429 only applies to HTTP handlers: a command has no 429"
        r.error(entries["limits"].value, (*path, "limits"), message)
    if r.problems:
        return None  # the config is rejected anyway; the values may be incomplete
    backoff = replace(defaults.backoff, **values.pop("backoff", {}))
    inherited = {
        "timeout": defaults.timeout,
        "max_attempts": defaults.max_attempts,
        "max_retry_after": defaults.max_retry_after,
    }
    handler: Handler = cls(type=name, backoff=backoff, **{**inherited, **values})
    return handler


def _handlers(r: Reader, node: yaml.Node, path: KeyPath, defaults: Defaults) -> dict[str, Handler]:
    handlers: dict[str, Handler] = {}
    for name, entry in r.entries(node, path, what="a mapping of job types to handlers").items():
        if not TYPE_PATTERN.fullmatch(name):
            r.error(entry.key, (*path, name), f"invalid job type name: {TYPE_RULE}")
        try:
            handler = _handler(r, entry.value, (*path, name), name, defaults)
        except Invalid as exc:
            r.error(entry.value, (*path, name), exc.message)
            continue
        if handler is not None:
            handlers[name] = handler
    return handlers


def _text(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    return r.text(node, "text")


def _positive(r: Reader, node: yaml.Node, path: KeyPath) -> int:
    return parse_int(r.text(node, "a whole number"), 1)


def _value(r: Reader, node: yaml.Node, path: KeyPath) -> Any:
    """Any YAML value, as YAML means it (a schedule's payload: a mapping, a list, a number...)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _string_map(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, str]:
    return {name: r.text(entry.value, "text") for name, entry in r.entries(node, path).items()}


#: How the config reads each kind of job option a schedule may give; make_spec checks the values.
_OPTION_READERS: Final[Mapping[Kind, Callable[[Option], Converter]]] = {
    Kind.DURATION: lambda _: _text,
    Kind.TEXT: lambda _: _text,
    Kind.COUNT: lambda option: _positive if option.minimum == 1 else integer(option.minimum),
    Kind.CHOICE: lambda option: choice(option.choices),
    Kind.STRINGS: lambda _: _string_map,
}

_SCHEDULE_FIELDS: Final[Mapping[str, Converter]] = {
    "type": _text,
    "payload": _value,
    "queue": _name,
    "cron": _text,
    "every": _text,
    "timezone": _text,
    "start": _text,
    "end": _text,
    "limit": _positive,
    "catchup": choice(CATCHUP),
    "catchup_window": _text,
    "overlap": choice(OVERLAP),
    **{name: _OPTION_READERS[OPTIONS[name].kind](OPTIONS[name]) for name in SCHEDULE_OPTIONS},
}


def _schedules(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[ScheduleSpec, ...]:
    specs = []
    for name, entry in r.entries(node, path, what="a mapping of schedule names to schedules").items():
        where = (*path, name)
        try:
            values = r.fields(r.entries(entry.value, where, _SCHEDULE_FIELDS), where, _SCHEDULE_FIELDS)
        except Invalid as exc:
            r.error(entry.value, where, exc.message)
            continue
        if "type" not in values:
            r.error(entry.value, where, "needs type: the job type each tick enqueues")
            continue
        try:
            specs.append(make_spec(name, **values))
        except InvalidJob as exc:
            r.error(entry.value, where, str(exc))
    return tuple(specs)


_TOP_FIELDS: Final[Mapping[str, Converter]] = {
    "redis": _redis,
    "namespace": _name,
    "queues": _queues,
    "strict_priority": boolean,
    "concurrency": integer(1),
    "lease": duration(1.0),
    "shutdown_timeout": duration(),
    "listen": _listen,
    "api_token": optional_string,
    "api_allowed_hosts": _host_names,
    "health_url": _optional_url,
    "log_level": choice(_LOG_LEVELS),
    "log_format": choice(_LOG_FORMATS),
    "result_ttl": duration(),
    "max_payload_bytes": size(1),
    "defaults": _defaults,
    "dead_letter": _section(DeadLetter, _DEAD_LETTER_FIELDS),
    "schedules": _schedules,
    "ui": _section(UiSettings, _UI_FIELDS),
    "history": boolean,
}

#: The keys the loader accepts in each part of the file (the JSON Schema in config/schema.json must match).
KNOWN_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "": (*_TOP_FIELDS, "handlers"),
    "redis": tuple(_REDIS_FIELDS),
    "defaults": tuple(_DEFAULTS_FIELDS),
    "backoff": tuple(_BACKOFF_FIELDS),
    "dead_letter": tuple(_DEAD_LETTER_FIELDS),
    "ui": tuple(_UI_FIELDS),
    "http handler": tuple(_HTTP_FIELDS),
    "command handler": tuple(_COMMAND_FIELDS),
    "schedule": tuple(_SCHEDULE_FIELDS),
    "limits": tuple(_LIMITS_FIELDS),
    "batch": tuple(_BATCH_FIELDS),
}


def _top_level(r: Reader, root: yaml.Node) -> dict[str, Any]:
    try:
        entries = r.entries(root, (), KNOWN_KEYS[""], what="a mapping of settings")
    except Invalid as exc:
        r.error(root, (), "the config " + exc.message)
        return {}
    values = r.fields(entries, (), _TOP_FIELDS)
    if "listen" in values:
        # `jobcar run` refuses the same (api.check_exposure), so `jobcar check` says it first.
        problem = exposure_problem(values["listen"], values.get("api_token"))
        if problem is not None:
            r.error(entries["listen"].value, ("listen",), problem.removeprefix(f"listen {values['listen']} "))
    for spec in values.get("schedules", ()):
        if spec.queue not in values.get("queues", {"default": 1}):
            node = r.entries(entries["schedules"].value, ("schedules",))[spec.name].value
            r.error(node, ("schedules", spec.name), f"queue {spec.queue!r} is not in queues: no daemon would fire it")
    if "handlers" in entries:
        # Handlers need the defaults, so they are read after every other key, wherever they stand in the file.
        node = entries["handlers"].value
        try:
            values["handlers"] = _handlers(r, node, ("handlers",), values.get("defaults", Defaults()))
        except Invalid as exc:
            r.error(node, ("handlers",), exc.message)
        _check_batch_sizes(r, node, values)
    return values


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
