"""The config's `handlers` section, one HTTP or command handler per job type, and the `defaults` they
inherit."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

import yaml

from jobcar.config_limits import batch_section, limits_section
from jobcar.config_settings import check_url, items
from jobcar.config_types import Backoff, BackoffStrategy, CommandHandler, Defaults, Handler, HttpHandler
from jobcar.config_values import boolean, choice, duration, integer, optional_string, parse_int, size
from jobcar.names import TYPE_PATTERN, TYPE_RULE
from jobcar.yaml_reader import Converter, Invalid, KeyPath, Reader, is_null

_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
_ENV_NAME: Final = re.compile(r"[^=\0]+")

_strategy_name: Final = choice(tuple(strategy.value for strategy in BackoffStrategy))


def _strategy(r: Reader, node: yaml.Node, path: KeyPath) -> BackoffStrategy:
    return BackoffStrategy(_strategy_name(r, node, path))


def _optional_secret(r: Reader, node: yaml.Node, path: KeyPath) -> str | None:
    return r.secret(node, "a string") or None


def _url(r: Reader, node: yaml.Node, path: KeyPath) -> str:
    return check_url(r.text(node, "a URL"))


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
#: Extra HTTP headers: a handler's, and the OTLP exporter's (`tracing.headers`).
HEADERS: Final = _headers
_env: Final = _secret_map(_ENV_NAME, "must not be empty or contain '='", "\0", "must not contain NUL characters")


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
    args = items(r, node, path, "an argv list like [/usr/local/bin/resize, --quality, '80']", _arg)
    if args is not None and (not args or not args[0]):
        raise Invalid("must name the program to run, like [/usr/local/bin/resize, --quality, '80']")
    return tuple(args or ())


def _env_name(text: str) -> str:
    if not _ENV_NAME.fullmatch(text):
        raise Invalid(f"invalid environment variable name {text!r}")
    return text


def _env_allow(r: Reader, node: yaml.Node, path: KeyPath) -> tuple[str, ...]:
    return tuple(items(r, node, path, "a list of environment variable names", _env_name) or ())


def _exit_codes(r: Reader, node: yaml.Node, path: KeyPath) -> frozenset[int]:
    codes = items(r, node, path, "a list of exit codes, like [64, 65]", lambda text: parse_int(text, 1, 255))
    return frozenset(codes or ())


BACKOFF_FIELDS: Final[Mapping[str, Converter]] = {
    "strategy": _strategy,
    "base": duration(),
    "max": duration(),
}


def _backoff(r: Reader, node: yaml.Node, path: KeyPath) -> dict[str, Any]:
    """Only the keys given: a handler's `backoff: {base: 2s}` is merged over the defaults' backoff."""
    return r.fields(r.entries(node, path, BACKOFF_FIELDS), path, BACKOFF_FIELDS)


DEFAULTS_FIELDS: Final[Mapping[str, Converter]] = {
    "timeout": duration(0.0, exclusive=True),
    "max_attempts": integer(1),
    "backoff": _backoff,
    "max_retry_after": duration(),
}


def defaults_section(r: Reader, node: yaml.Node, path: KeyPath) -> Defaults:
    values = r.fields(r.entries(node, path, DEFAULTS_FIELDS), path, DEFAULTS_FIELDS)
    return Defaults(**{**values, "backoff": Backoff(**values.get("backoff", {}))})


_HANDLER_FIELDS: Final[Mapping[str, Converter]] = {
    **DEFAULTS_FIELDS,
    "concurrency": integer(1, optional=True),
    "limits": limits_section,
    "batch": batch_section,
    "max_extend": duration(),
    "max_snoozes": integer(0),
    "max_pending": integer(1, optional=True),
}
HTTP_FIELDS: Final[Mapping[str, Converter]] = {
    "url": _url,
    **_HANDLER_FIELDS,
    "headers": _headers,
    "signing_secret": _optional_secret,
    "max_response_bytes": size(),
}
COMMAND_FIELDS: Final[Mapping[str, Converter]] = {
    "command": _argv,
    **_HANDLER_FIELDS,
    "env": _env,
    "env_allow": _env_allow,
    "permanent_exit_codes": _exit_codes,
    "kill_grace": duration(),
    "max_output_bytes": size(),
    "cwd": optional_string,
    "log_stderr": boolean,
}
_HTTP_ONLY: Final = {
    key: "only applies to HTTP handlers (this one has a command)" for key in HTTP_FIELDS.keys() - COMMAND_FIELDS
}
_COMMAND_ONLY: Final = {
    key: "only applies to command handlers (this one has a url)" for key in COMMAND_FIELDS.keys() - HTTP_FIELDS
}


def _handler(r: Reader, node: yaml.Node, path: KeyPath, name: str, defaults: Defaults) -> Handler | None:
    entries = r.entries(node, path, what="a mapping with url (an HTTP handler) or command (a command handler)")
    if "url" in entries and "command" in entries:
        r.error(entries["command"].key, path, "has both url and command: a handler is one or the other")
        r.reject_unknown(entries, path, {**HTTP_FIELDS, **COMMAND_FIELDS})
    elif "url" not in entries and "command" not in entries:
        r.error(node, path, "needs url (an HTTP handler) or command (a command handler)")
        r.reject_unknown(entries, path, {**HTTP_FIELDS, **COMMAND_FIELDS})
    elif "url" in entries:
        r.reject_unknown(entries, path, HTTP_FIELDS, _COMMAND_ONLY)
    else:
        r.reject_unknown(entries, path, COMMAND_FIELDS, _HTTP_ONLY)
    cls, table = (HttpHandler, HTTP_FIELDS) if "url" in entries else (CommandHandler, COMMAND_FIELDS)
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


def handlers_section(r: Reader, node: yaml.Node, path: KeyPath, defaults: Defaults) -> dict[str, Handler]:
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
