"""Which requests a web browser made for a page, which the API refuses: jobcar has no browser clients; and the
bearer token, which a browser never adds on its own.

A page the user visits can make the browser send requests to 127.0.0.1:9321. Three rules stop them (ADR 0009),
each on what a browser always sends and a page cannot change:

- `Host`, while the API is open (no `api_token`): a loopback name, an IP address, or a configured name. DNS
  rebinding (a name of the attacker's that starts resolving to 127.0.0.1) makes the page same-origin with the
  daemon as far as the browser knows, so it may read the answers: only `Host` still names the attacker's site.
  With a token, a rebound page gains nothing: a browser never adds a bearer token on its own.
- `Origin` and `Sec-Fetch-Site`, on every route: a browser sends them (`Origin` on every POST, PUT, DELETE and
  cross-origin fetch; `Sec-Fetch-Site` on every request, in current browsers), producers and probes do not.
  Anything but same-origin or a user's own navigation is refused, reads included: a page cannot read the answer
  of a cross-origin GET, but it can tell a 200 from a 404 by whether a `<script src>` loads.
- `Content-Type` on the JSON routes (in `api.py`): a page can send text/plain, a form or multipart without
  asking; application/json needs a CORS preflight, which jobcar never grants.

Standard library only; every function takes header values as received (None when absent).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Collection
from typing import Final
from urllib.parse import urlsplit

#: Sec-Fetch-Site values a page of another origin cannot cause: its own origin, or the user typing the URL.
SAME_ORIGIN_SITES: Final = frozenset({"same-origin", "none"})
#: `localhost` and its subdomains, which browsers resolve to loopback themselves, never through DNS (RFC 6761).
LOOPBACK_NAME: Final = re.compile(r"(?:[a-z0-9-]+\.)*localhost")
#: A DNS host name (as `allowed_hosts` lists them), lower case, without a trailing dot.
HOST_NAME: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_PORT: Final = re.compile(r"[0-9]{1,5}")
_SHOWN: Final = 100  # characters of a header value quoted in an answer


def host_name(host_header: str) -> str | None:
    """The name or address of a `Host` header ("name:port", "name", "[v6]:port"), lower case and without the
    brackets of an IPv6 address; None when it is not a host and optional port."""
    if host_header.startswith("["):
        address, bracket, port = host_header[1:].partition("]")
        if not bracket or (port and not (port.startswith(":") and _PORT.fullmatch(port[1:]))):
            return None
        try:
            return str(ipaddress.IPv6Address(address))
        except ValueError:
            return None
    name, colon, port = host_header.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    name = name.lower()
    return name if HOST_NAME.fullmatch(name) else None


@functools.lru_cache(maxsize=256)
def is_ip_address(name: str) -> bool:
    """Whether `name` is an IPv4 or IPv6 address (without brackets) rather than a DNS name. Remembered (bounded):
    asked of every request's Host, which is one of a few names, and ipaddress parses slowly."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_problem(host_header: str | None, allowed_hosts: Collection[str]) -> str | None:
    """Why a request with this `Host` may come from a page behind a rebound DNS name, or None.

    Accepted: no Host at all (every browser sends one), an IP address (a page whose origin is an address has no
    name to rebind: kubelet and Prometheus send `Host: <pod ip>:port`), `localhost` and `*.localhost`, and the
    names in `allowed_hosts` (lower case). The port is not checked: a rebinding page may use the daemon's own,
    and port forwards (`kubectl port-forward`, a published container port) change it for honest clients."""
    if host_header is None:
        return None
    name = host_name(host_header)
    if name is not None and (is_ip_address(name) or LOOPBACK_NAME.fullmatch(name) or name in allowed_hosts):
        return None
    return (f"this daemon does not answer to the host name {host_header[:_SHOWN]!r} without api_token: use "
            "127.0.0.1, localhost or an IP address, or list the name in api_allowed_hosts")  # fmt: skip


def cross_site_problem(origin: str | None, fetch_site: str | None, host_header: str | None) -> str | None:
    """Why a request looks sent by a browser for a page of another origin (a web page, not a producer), or None.

    Same-origin means the `Origin` header names the host and port the request was sent to (its `Host`); the
    scheme may be https behind a TLS terminator. `Origin: null` (a sandboxed frame, a redirect) is refused."""
    if fetch_site is not None and fetch_site.lower() not in SAME_ORIGIN_SITES:
        return (f"refused: a browser sent this request for a page of another site (Sec-Fetch-Site: "
                f"{fetch_site[:_SHOWN]}); the jobcar API takes no requests from web pages")  # fmt: skip
    if origin is not None and not _same_origin(origin, host_header):
        return (f"refused: a browser sent this request for a page of another site (Origin: {origin[:_SHOWN]}); "
                "the jobcar API takes no requests from web pages")  # fmt: skip
    return None


def _same_origin(origin: str, host_header: str | None) -> bool:
    if host_header is None:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.lower()
