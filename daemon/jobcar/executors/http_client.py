"""A lean HTTP/1.1 client for handler requests: one POST per job over keep-alive connections.

Why not aiohttp's `ClientSession`: under `make bench` (nginx answering 204) most of the daemon's CPU
went to `ClientSession._request` (ADR 0004) — URL objects, header multidicts, tracing hooks, cookie jars,
timers and a stream reader per request, none of which a job POST needs. This client does one thing:
write a request head the executor built, feed the answer to llhttp (Node's parser, through httptools)
and hand back the status, the headers and the body up to a cap. See docs/adr/0004-lean-http-client.md.

What it deliberately does not do: follow redirects (the executor treats 3xx as permanent), proxies
(jobcar never read proxy variables), cookies, compression, pipelining, or retry a request on its own
(a request that failed is the job's failed attempt, like any other).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import unquote, urlsplit

import httptools

__all__ = [
    "BadResponse",
    "ConnectFailed",
    "ConnectionClosed",
    "HttpClient",
    "Origin",
    "RequestFailed",
    "Response",
    "Target",
    "parse_url",
]

#: Idle keep-alive connections are dropped after this long, below the keep-alive timeout of most servers
#: (nginx 75 s, aiohttp 75 s, Go 180 s; Node's 5 s closes first and is seen by connection_lost).
KEEPALIVE_S: Final = 15.0
#: A status line and headers longer than this are refused: an endless head never lands in memory.
MAX_HEAD_BYTES: Final = 64 * 1024
#: Headers that delimit a body; without either, it ends when the connection does.
_FRAMING_HEADERS: Final = frozenset({b"content-length", b"transfer-encoding"})
_FRAMING_LENGTHS: Final = frozenset(len(name) for name in _FRAMING_HEADERS)
#: Below this a body goes out in one write with its head (one segment for small jobs).
_JOIN_BELOW: Final = 16 * 1024


class RequestFailed(Exception):
    """A request got no complete answer; the subclass says why, the message says how."""


class ConnectFailed(RequestFailed):
    """No connection could be made (refused, unreachable, DNS, TLS handshake)."""


class ConnectionClosed(RequestFailed):
    """The connection was closed or reset before the answer was complete."""


class BadResponse(RequestFailed):
    """The server answered with bytes that are not an HTTP/1.x response."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where connections go; connections are pooled per origin."""

    host: str
    port: int
    tls: bool


@dataclass(frozen=True, slots=True)
class Target:
    """A handler URL taken apart once: where to connect, what to put in the request line and Host."""

    origin: Origin
    path: str  # path and query, as sent in the request line
    host_header: str
    #: `Authorization: Basic …` from user:password in the URL, else None.
    authorization: str | None


def parse_url(url: str) -> Target:
    """Split an http:// or https:// URL; ValueError names what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    tls = parts.scheme == "https"
    default_port = 443 if tls else 80
    port = parts.port or default_port
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default_port else f"{shown}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(credentials).decode()
    return Target(Origin(host, port, tls), path, host_header, authorization)


class Response:
    __slots__ = ("_headers", "body", "reason", "status", "truncated")

    def __init__(self, status: int, reason: str, headers: list[tuple[bytes, bytes]], body: bytes, truncated: bool):
        self.status = status
        self.reason = reason
        self.body = body
        #: The body was longer than the caller's limit; `body` holds its start.
        self.truncated = truncated
        self._headers = headers

    def header(self, name: str) -> str | None:
        """The last value of a header (names compare case-insensitively), None when absent."""
        wanted = name.lower().encode("latin-1")
        for key, value in reversed(self._headers):
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[Response] | None = None
        self._limit = 0
        self._parser: httptools.HttpResponseParser | None = None
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._body_size = 0
        self._head_size = 0
        self._head_done = False
        self._framed = False  # the answer has Content-Length or Transfer-Encoding
        self._until_close = False  # no Content-Length and not chunked: the body ends when the connection does
        self._finished = True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport has the asyncio.Transport interface without being a subclass of it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._finished or self._parser is None:
            # Bytes that answer no request: whatever the server meant, this connection is not reused.
            self.reusable = False
            self.abort()
            return
        if not self._head_done:
            self._head_size += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"invalid HTTP response: {exc}"))
            return
        if not self._head_done and self._head_size > MAX_HEAD_BYTES:
            self._fail(BadResponse(f"response head longer than {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._finished:
            return
        if self._head_done and self._until_close and exc is None:
            self._finish(truncated=False)  # a close, not a reset, is how such a body ends
        elif exc is not None:
            self._fail(ConnectionClosed(str(exc) or type(exc).__name__))
        else:
            self._fail(ConnectionClosed("the server closed the connection before the response was complete"))

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._finished:
            # A second answer in the same read: nothing was asked, so the stream cannot be trusted.
            self.reusable = False

    def on_status(self, reason: bytes) -> None:
        if not self._finished:
            self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._finished:
            self._headers.append((name, value))
            if len(name) in _FRAMING_LENGTHS and name.lower() in _FRAMING_HEADERS:
                self._framed = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        if self._finished:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        self._head_done = True
        self._until_close = not self._framed

    def on_body(self, chunk: bytes) -> None:
        if self._finished:
            return
        room = self._limit - self._body_size
        if len(chunk) > room:
            if room > 0:
                self._body.append(chunk[:room])
                self._body_size += room
            # The rest is never read: answer now and drop the connection (its stream is mid-body).
            self._finish(truncated=True)
            self.abort()
            return
        self._body.append(chunk)
        self._body_size += len(chunk)

    def on_message_complete(self) -> None:
        if self._finished:
            return
        if not self._head_done:  # the end of an interim answer
            self._reason, self._headers, self._head_size, self._framed = b"", [], 0, False
            return
        self._finish(truncated=False)

    # the request

    def request(self, first: bytes, rest: bytes, limit: int) -> asyncio.Future[Response]:
        """Send one request (`first`, then `rest` when the body was too big to join); the future gets
        the answer. Whoever stops waiting for it before it is done must call `abandon()`."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Response] = loop.create_future()
        self._waiter = waiter
        self._parser = httptools.HttpResponseParser(self)
        self._limit = limit
        self._reason, self._headers, self._body = b"", [], []
        self._body_size = self._head_size = 0
        self._head_done = self._until_close = self._finished = self._framed = False
        self.reusable = False
        self.transport.write(first)
        if rest:
            self.transport.write(rest)
        return waiter

    def abandon(self) -> None:
        """The request's caller was cancelled or timed out mid-request: the stream is in an unknown
        state, so the connection goes (and the handler sees the client leave, as with any HTTP client)."""
        self._finished = True
        self.abort()

    def time_out(self) -> None:
        """The request's deadline passed: fail it with TimeoutError and drop the connection."""
        if not self._finished:
            self._fail(TimeoutError())

    def _finish(self, *, truncated: bool) -> None:
        assert self._parser is not None
        assert self._waiter is not None
        self._finished = True
        self.reusable = not truncated and not self.closed and self._parser.should_keep_alive()
        status = self._parser.get_status_code()
        reason = self._reason.decode("latin-1").strip()
        response = Response(status, reason, self._headers, b"".join(self._body), truncated)
        if not self._waiter.done():
            self._waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        self._finished = True
        self.reusable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """Keep-alive connections per origin, shared by every HTTP handler of the daemon."""

    def __init__(self, *, keepalive: float = KEEPALIVE_S, ssl_context: ssl.SSLContext | None = None) -> None:
        self._keepalive = keepalive
        self._ssl_context = ssl_context
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def post(self, origin: Origin, head: bytes, body: bytes, limit: int, deadline: float) -> Response:
        """Send a request whose head the caller built (request line to the blank line) and read the answer.

        The body is read up to `limit` bytes (`Response.truncated` says when there was more). `deadline`
        is in the running loop's clock (`loop.time()`): connecting, sending and reading all end there
        with TimeoutError. Otherwise a `RequestFailed` subclass when there is no complete answer.
        """
        connection = self._idle_connection(origin)
        if connection is None:
            async with asyncio.timeout_at(deadline):
                connection = await self._connect(origin)
        first, rest = (head + body, b"") if len(body) < _JOIN_BELOW else (head, body)
        # A timer callback, not asyncio.timeout, which costs a request a third more CPU (ADR 0006); this
        # timer costs next to nothing.
        timer = asyncio.get_running_loop().call_at(deadline, connection.time_out)
        try:
            # The future itself, not a coroutine around it: one layer less to create and resume per job.
            response = await connection.request(first, rest, limit)
        except BaseException:
            connection.abandon()
            raise
        finally:
            timer.cancel()
            if connection.reusable and not connection.closed:
                connection.idle_since = time.monotonic()
                self._idle.setdefault(origin, deque()).append(connection)
            else:
                # Not reusable (Connection: close, a cut body, an error): close it now (RFC 9112 §9.6).
                self._retire(connection)
        return response

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        stale_before = time.monotonic() - self._keepalive
        # The oldest ones expire first; then take the most recently used (warmest) one.
        while idle and (idle[0].closed or idle[0].idle_since < stale_before):
            self._retire(idle.popleft())
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
            self._retire(connection)
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if origin.tls:
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            context = self._ssl_context
        try:
            _, connection = await loop.create_connection(
                _Connection, origin.host, origin.port, ssl=context, server_hostname=origin.host if context else None
            )
        except OSError as exc:  # refused, unreachable, DNS (socket.gaierror), TLS (ssl.SSLError)
            raise ConnectFailed(f"{origin.host}:{origin.port}: {exc}") from exc
        self._open.add(connection)
        return connection

    def _retire(self, connection: _Connection) -> None:
        connection.reusable = False
        connection.abort()
        self._open.discard(connection)

    async def close(self) -> None:
        """Close every connection, idle or busy (busy requests then fail)."""
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        self._idle.clear()
