"""The config's plain top-level settings (redis, namespace, queues, listen, the API's hosts, health_url,
dead_letter, ui), and the name, URL and list converters the sections share with them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import yaml

from jobcar.browser_guard import HOST_NAME, is_ip_address
from jobcar.config_types import ApiTokenSetting, RedisSettings
from jobcar.config_values import boolean, choice, duration, integer, parse_int, size, string
from jobcar.listen import parse_listen
from jobcar.names import NAME_PATTERN, NAME_RULE, QUEUE_PATTERN, QUEUE_PATTERN_RULE, is_queue_pattern
from jobcar.redis_url import is_sentinel_url, redis_url_problem
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("auto", "json", "console")

_T = TypeVar("_T")


def valid_name(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "a name")
    if not NAME_PATTERN.fullmatch(text):
        raise Invalid(f"invalid name {text!r}: {NAME_RULE}")
    return text


def check_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise Invalid(f"invalid URL {text!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"\s", text):
        raise Invalid(f"must be an http:// or https:// URL, not {text!r}")
    return text


def optional_url(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    text = r.scalar(node, "a URL")
    return check_url(text) if text else None


def items(r: Reader, node: yaml.Node, path: KeyPath, what: str, convert: Callable[[str], _T]) -> list[_T] | None:
    """Each scalar of a list, converted; None when any of them was reported."""
    converted: list[_T] = []
    ok = True
    for index, item in enumerate(r.sequence(node, what)):
        try:
            converted.append(convert(r.text(item, "a string")))
        except Invalid as exc:
            r.error(item, (*path, f"[{index}]"), exc.message)
            ok = False
    return converted if ok else None


def listen(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = r.text(node, "host:port")
    try:
        parse_listen(text)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    return text


def queues(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, int]:
    """Queue names and patterns (`tenant-*`, ADR 0027) to weights, in the file's order; config.py splits them
    into `queues` and `queue_patterns`."""
    entries = r.entries(node, path, what="a mapping of queue names to weights, like {critical: 6, default: 3}")
    if not entries:
        raise Invalid("must name at least one queue, like {default: 1}")
    weights: dict[str, int] = {}
    for queue, entry in entries.items():
        if is_queue_pattern(queue):
            if not QUEUE_PATTERN.fullmatch(queue):
                r.error(entry.key, (*path, queue), f"invalid queue pattern: {QUEUE_PATTERN_RULE}")
        elif not NAME_PATTERN.fullmatch(queue):
            r.error(entry.key, (*path, queue), f"invalid queue name: {NAME_RULE}")
        try:
            weights[queue] = parse_int(r.text(entry.value, "a weight (a positive integer)"), 1)
        except Invalid as exc:
            r.error(entry.value, (*path, queue), exc.message)
    return weights


def max_pending(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, int]:
    """`max_pending`: queue -> the most pending jobs an enqueue may leave it with (ADR 0024)."""
    entries = r.entries(node, path, what="a mapping of queue names to positive integers, like {default: 100000}")
    bounds: dict[str, int] = {}
    for queue, entry in entries.items():
        try:
            bounds[queue] = parse_int(r.text(entry.value, "a positive integer"), 1)
        except Invalid as exc:
            r.error(entry.value, (*path, queue), exc.message)
    return bounds


def _host_name(text: str) -> str:
    host = text.lower()
    if is_ip_address(host.strip("[]")):
        raise Invalid(f"{text!r} is an IP address, which the API always answers to: list host names only")
    if not HOST_NAME.fullmatch(host):
        raise Invalid(f"must be a host name like jobcar.internal, without a scheme or a port, not {text!r}")
    return host


def host_names(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[str, ...]:
    return tuple(items(r, node, path, "a list of host names, like [jobcar.internal]", _host_name) or ())


def section(cls: Callable[..., Any], table: Mapping[str, Converter]) -> Converter:
    """A mapping of the keys in `table`, into `cls`."""

    def convert(r: Reader, node: yaml.Node, path: KeyPath) -> Any:
        return cls(**r.fields(r.entries(node, path, table), path, table))

    return convert


def _redis_url(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    text = string(r, node, path)
    problem = redis_url_problem(text)
    if problem is not None:
        raise Invalid(problem)
    return text


REDIS_FIELDS: Final[Mapping[str, Converter]] = {
    "url": _redis_url,
    "cluster": boolean,
    "strict": boolean,
    "data_dir": string,
}


def redis_section(r: Reader, node: yaml.Node, path: KeyPath) -> RedisSettings:
    settings: RedisSettings = section(RedisSettings, REDIS_FIELDS)(r, node, path)
    if settings.cluster and is_sentinel_url(settings.url):
        # `jobcar run` could not connect so either: redis-py finds a Cluster's nodes itself, never through Sentinel.
        raise Invalid("cluster is true but url is a Sentinel URL: a Redis Cluster is reached through a node's URL")
    return settings


DEAD_LETTER_FIELDS: Final[Mapping[str, Converter]] = {
    "max_jobs": integer(1),
    "max_age": duration(0.0, exclusive=True),
}

UI_FIELDS: Final[Mapping[str, Converter]] = {
    "enabled": boolean,
    "write": boolean,
}


def ratio(r: Reader, node: yaml.Node, path: KeyPath) -> float:
    text = r.text(node, "a number from 0 to 1")
    try:
        value = float(text)
    except ValueError:
        raise Invalid(f"must be a number from 0 to 1, not {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise Invalid(f"must be from 0 to 1, not {text!r}")
    return value


def trace_url(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    """A URL template with `{trace_id}` (Jaeger: http://jaeger:16686/trace/{trace_id})."""
    text = r.scalar(node, "a URL with {trace_id}")
    if not text:
        return None
    if "{trace_id}" not in text:
        raise Invalid(f"must hold {{trace_id}}, where the trace's id goes, not {text!r}")
    check_url(text.replace("{trace_id}", "0" * 32))
    return text


HANDLER_API_FIELDS: Final[Mapping[str, Converter]] = {
    "url": optional_url,
    "max_log_lines": integer(1),
    "max_log_bytes": size(1),
    "max_line_bytes": size(1),
    "max_steps": integer(1),
    "max_step_bytes": size(1),
    "max_children": integer(1),
}


API_TOKEN_ROLES: Final = ("read", "produce", "operate")
API_TOKEN_FIELDS: Final[Mapping[str, Converter]] = {
    "role": choice(API_TOKEN_ROLES),
    "token": lambda r, node, path: _token(r, node),
    "token_file": string,
}


def _token(r: Reader, node: yaml.Node) -> str | None:
    """A token's value, ${VAR} expanded. A command that runs no daemon may lack the variable: no value then."""
    text = r.secret(node, "a token")
    if not text and r.secrets_needed:
        raise Invalid("must not be empty")
    return text or None


def api_tokens(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[ApiTokenSetting, ...]:
    """`api_tokens`: name -> {role, token | token_file} (api_tokens.py, ADR 0026). A token file is read now, so at
    start and on every reload; by a command that runs no daemon (secrets not needed), one it cannot read is left
    without a value (it then matches nothing) instead of failing."""
    entries = r.entries(node, path, what="a mapping of token names to {role, token | token_file}")
    settings: list[ApiTokenSetting] = []
    for name, entry in entries.items():
        where = (*path, name)
        if not NAME_PATTERN.fullmatch(name):
            r.error(entry.key, where, f"invalid token name: {NAME_RULE}")
            continue
        try:
            given = r.entries(entry.value, where, API_TOKEN_FIELDS)
        except Invalid as exc:
            r.error(entry.value, where, exc.message)
            continue
        values = r.fields(given, where, API_TOKEN_FIELDS)
        if "role" not in given:
            r.error(entry.value, where, f"role is required: one of {', '.join(API_TOKEN_ROLES)}")
            continue
        if ("token" in given) == ("token_file" in given):
            r.error(entry.value, where, "give token (the value, or ${VAR}) or token_file (a file holding it), one")
            continue
        if "role" not in values or ("token" in given and "token" not in values):
            continue  # reported
        if "token_file" in values:
            values["token"] = _read_token_file(r, entry.value, where, values["token_file"])
        settings.append(ApiTokenSetting(name=name, **values))
    return tuple(settings)


def _read_token_file(r: Reader, node: yaml.Node, path: KeyPath, file: str) -> str | None:
    """The token a file holds (without the white space around it); a path is relative to the config file's folder."""
    where = Path(r.source).parent / file
    try:
        token = where.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        if r.secrets_needed:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            r.error(node, (*path, "token_file"), f"cannot read {file}: {reason}")
        return None
    if not token and r.secrets_needed:
        r.error(node, (*path, "token_file"), f"{file} is empty")
    return token or None
