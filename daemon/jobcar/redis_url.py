"""What a Redis URL may be, decided once for `jobcar check`, `jobcar run` and every command: the schemes
redis-py connects with, a numeric port in range, a numeric database; and the Sentinel form, parsed here
into its parts for every client that connects through Sentinel. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

from jobcar.formats import redact

#: The URL that starts the bundled server instead (development only).
EMBEDDED_URL: Final = "embedded"
SCHEMES: Final = ("redis", "rediss", "unix")
#: A primary found through Redis Sentinel; `rediss+sentinel` speaks TLS to the sentinels and the servers.
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT: Final = 26379
#: The longest WAIT an enqueue may send: well inside the clients' socket timeouts (COMMAND_TIMEOUT, 10 s).
WAIT_TIMEOUT_MAX_MS: Final = 5000
#: The options a Sentinel URL's query may set, with what each takes (see SentinelURL).
_SENTINEL_OPTIONS: Final = {
    "sentinel_username": "a user name",
    "sentinel_password": "a password",
    "wait_replicas": "a whole number >= 0",
    "wait_timeout_ms": f"a whole number of milliseconds from 1 to {WAIT_TIMEOUT_MAX_MS}",
    "ssl_ca_certs": "a file",
    "ssl_certfile": "a file",
    "ssl_keyfile": "a file",
    "ssl_cert_reqs": "none, optional or required",
    "ssl_check_hostname": "true or false",
}
_TLS_OPTIONS: Final = tuple(name for name in _SENTINEL_OPTIONS if name.startswith("ssl_"))
#: The query options whose values messages may show; any other's (a password, a misspelt one...) is hidden.
_SHOWN_OPTIONS: Final = frozenset(_SENTINEL_OPTIONS) - {"sentinel_username", "sentinel_password"}
_QUERY_VALUE: Final = re.compile(r"(?<=[?&])(?P<name>[^&=#\s]*)=(?P<value>[^&#\s]*)")
_HOST: Final = re.compile(r"\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+)")
_SERVICE: Final = re.compile(r"[^\s/]+")


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A `redis+sentinel://` URL's parts:
    `redis+sentinel://[[user][:password]@]host[:port][,host[:port]...]/service[/db][?option=value&...]`.

    The credentials before `@` are the Redis servers' (primary and replicas); the sentinels' own are the
    `sentinel_username` and `sentinel_password` options. `wait_replicas` replicas (default 1, 0 for
    none) must confirm each enqueue within `wait_timeout_ms` before it is acknowledged
    (docs/delivery-semantics.md). With `rediss+sentinel://`, the `ssl_*` options apply to the sentinels'
    connections and the servers' alike.
    """

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False
    tls_options: dict[str, str | bool] = field(default_factory=dict)
    wait_replicas: int = 1
    wait_timeout_ms: int = 1000


def shown_url(url: str) -> str:
    """`url` as messages may show it: no credentials before `@`, and of its query's values only those of the
    known options that hold no secret."""

    def hide(match: re.Match[str]) -> str:
        return match[0] if match["name"] in _SHOWN_OPTIONS else f"{match['name']}=***"

    return _QUERY_VALUE.sub(hide, redact(url))


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def redis_url_problem(url: str) -> str | None:
    """Why jobcar cannot connect with `url`, or None. The message shows the URL without credentials."""
    if url == EMBEDDED_URL:
        return None
    if is_sentinel_url(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            return str(exc)
        return None
    shown = shown_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # a ValueError for a port that is not a number in range
    except ValueError as exc:
        return f"invalid Redis URL {shown!r}: {exc}"
    if parts.scheme not in SCHEMES:
        return (
            f"{shown!r} is not a Redis URL: use redis://, rediss:// (TLS), unix://, redis+sentinel:// or "
            "rediss+sentinel:// (Redis Sentinel), or `embedded`"
        )
    if re.search(r"\s", url):
        return f"invalid Redis URL {shown!r}: it holds white space"
    if parts.scheme == "unix":
        return None if parts.path else f"invalid Redis URL {shown!r}: no socket path"
    if not parts.hostname:
        return f"invalid Redis URL {shown!r}: no host"
    if port == 0:
        return f"invalid Redis URL {shown!r}: port 0"
    database = unquote(parts.path).strip("/")
    if database and not database.isdigit():
        return f"invalid Redis URL {shown!r}: the database must be a number, like /0, not {database!r}"
    return None


def parse_sentinel_url(url: str) -> SentinelURL:
    """The parts of a Sentinel URL (see SentinelURL), or ValueError saying what is wrong, without credentials.
    The one parser of these URLs: `jobcar check`, the daemon, the CLI, the client and the Spark helper."""
    shown = shown_url(url)

    def invalid(reason: str) -> ValueError:
        return ValueError(f"invalid Redis Sentinel URL {shown!r}: {reason}")

    if re.search(r"\s", url):
        raise invalid("it holds white space")
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SENTINEL_SCHEMES:
        raise invalid(f"the scheme must be one of {', '.join(SENTINEL_SCHEMES)}")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise invalid("it has a #fragment")
    rest, _, query = rest.partition("?")
    location, slash, path = rest.partition("/")
    userinfo, at, hosts = location.rpartition("@")
    if not at:
        userinfo = ""
    username, colon, password = userinfo.partition(":")
    sentinels = tuple(_sentinel_address(host, invalid) for host in hosts.split(","))
    segments = path.split("/") if slash else []
    if not segments or not segments[0]:
        raise invalid("no service name: give the name the sentinels monitor, like /mymaster")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise invalid("the path must be /service_name or /service_name/db, with db a number like /0")
    service_name = unquote(segments[0])
    if not _SERVICE.fullmatch(service_name):
        raise invalid(f"invalid service name {service_name!r}")
    options = _options(query, invalid)
    tls = scheme.lower() == "rediss+sentinel"
    tls_given = sorted(name for name in options if name in _TLS_OPTIONS)
    if tls_given and not tls:
        raise invalid(f"{', '.join(tls_given)} need TLS: use rediss+sentinel://")
    wait_replicas = _whole(options.pop("wait_replicas", "1"), "wait_replicas", 0, None, invalid)
    wait_timeout_ms = _whole(options.pop("wait_timeout_ms", "1000"), "wait_timeout_ms", 1, WAIT_TIMEOUT_MAX_MS, invalid)
    sentinel_username = options.pop("sentinel_username", None)
    sentinel_password = options.pop("sentinel_password", None)
    tls_options: dict[str, str | bool] = {name: options[name] for name in tls_given}
    if "ssl_check_hostname" in tls_options:
        tls_options["ssl_check_hostname"] = _flag(options["ssl_check_hostname"], "ssl_check_hostname", invalid)
    if tls_options.get("ssl_cert_reqs", "required") not in ("none", "optional", "required"):
        raise invalid(f"ssl_cert_reqs must be {_SENTINEL_OPTIONS['ssl_cert_reqs']}")
    return SentinelURL(
        sentinels=sentinels,
        service_name=service_name,
        db=int(segments[1]) if len(segments) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) if colon else None,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
        tls=tls,
        tls_options=tls_options,
        wait_replicas=wait_replicas,
        wait_timeout_ms=wait_timeout_ms,
    )


def _sentinel_address(text: str, invalid: Callable[[str], ValueError]) -> tuple[str, int]:
    match = _HOST.match(text)
    if not text or match is None:
        raise invalid(f"no sentinel host in {text!r}: list them as host:port,host:port")
    host = match["v6"] or match["name"]
    port_text = text[match.end() :]
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.startswith(":") or not port_text[1:].isdigit() or not 0 < int(port_text[1:]) < 65536:
        raise invalid(f"the sentinel {text!r} must be host:port, with a port from 1 to 65535")
    return host, int(port_text[1:])


def _options(query: str, invalid: Callable[[str], ValueError]) -> dict[str, str]:
    options: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise invalid("its query is not name=value pairs joined by &") from None
    for name, value in pairs:
        if name not in _SENTINEL_OPTIONS:
            raise invalid(f"unknown option {name!r} (known: {', '.join(_SENTINEL_OPTIONS)})")
        if name in options:
            raise invalid(f"option {name!r} is given twice")
        if not value:
            raise invalid(f"option {name!r} needs {_SENTINEL_OPTIONS[name]}")
        options[name] = value
    return options


def _whole(text: str, name: str, low: int, high: int | None, invalid: Callable[[str], ValueError]) -> int:
    if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        raise invalid(f"{name} must be {_SENTINEL_OPTIONS[name]}, not {text!r}")
    return int(text)


def _flag(text: str, name: str, invalid: Callable[[str], ValueError]) -> bool:
    if text.lower() not in ("true", "false"):
        raise invalid(f"{name} must be {_SENTINEL_OPTIONS[name]}, not {text!r}")
    return text.lower() == "true"
