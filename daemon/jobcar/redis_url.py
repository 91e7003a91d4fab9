"""What a Redis URL may be, decided once for `jobcar check`, `jobcar run` and every command: the schemes
redis-py connects with, a numeric port in range, a numeric database. Standard library only."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote, urlsplit

from jobcar.formats import redact

#: The URL that starts the bundled server instead (development only).
EMBEDDED_URL: Final = "embedded"
SCHEMES: Final = ("redis", "rediss", "unix")


def redis_url_problem(url: str) -> str | None:
    """Why jobcar cannot connect with `url`, or None. The message shows the URL without credentials."""
    if url == EMBEDDED_URL:
        return None
    shown = redact(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # a ValueError for a port that is not a number in range
    except ValueError as exc:
        return f"invalid Redis URL {shown!r}: {exc}"
    if parts.scheme == "redis+sentinel":
        return f"{shown!r}: Redis Sentinel URLs are not supported yet; give the primary's redis:// URL"
    if parts.scheme not in SCHEMES:
        return f"{shown!r} is not a Redis URL: use redis://, rediss:// (TLS) or unix://, or `embedded`"
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
