"""`listen` addresses (`host:port`, `[v6 address]:port`): parsed by one rule for the config, the daemon's
listener and the CLI's `health` command. Standard library only."""

from __future__ import annotations

import ipaddress
import re
from typing import Final

_HOST: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def parse_listen(listen: str) -> tuple[str, int]:
    """(host, port) from "host:port" or "[v6 address]:port" (the host without brackets); ValueError says
    what is wrong."""
    host, colon, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv6 address in {listen!r}") from None
    elif ":" in host:
        raise ValueError(f"must be host:port with an IPv6 address in brackets, like [::1]:9321, not {listen!r}")
    elif not colon or not _HOST.fullmatch(host):
        raise ValueError(f"must be host:port, like 127.0.0.1:9321 or [::1]:9321, not {listen!r}")
    if not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
        raise ValueError(f"port must be a number from 0 to 65535, not {port!r}")
    return host, int(port)


def is_loopback(listen: str) -> bool:
    """Whether `listen` binds a loopback address only: 127.0.0.0/8, ::1 or the name localhost."""
    try:
        host, _ = parse_listen(listen)
        return host.lower() == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # unparsable, or a name that may resolve to anything


def local_url(listen: str, path: str) -> str:
    """The http:// URL of `path` on a server listening on `listen`; one listening on every address
    (0.0.0.0, [::]) is reached on loopback."""
    host, port = parse_listen(listen)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None  # a host name
    if address is not None and address.is_unspecified:
        host = "127.0.0.1" if address.version == 4 else "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def exposure_problem(listen: str, has_token: bool) -> str | None:
    """Why serving the API on `listen` without a token (`has_token`: api_token or one of api_tokens) is refused
    (anyone who reaches a non-loopback address could enqueue, read and cancel jobs), or None."""
    if has_token or is_loopback(listen):
        return None
    return (f"listen {listen} is not a loopback address and api_token is not set, so anyone who reaches it "
            "could enqueue, read and cancel jobs: set api_token or listen on 127.0.0.1")  # fmt: skip
