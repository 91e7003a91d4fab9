"""HttpClient (executors/http_client.py, ADR 0004) against real servers on 127.0.0.1, no mocks.

Byte-exact answers come from `RawServer` (asyncio.start_server, every byte written by hand, every accepted
connection counted); HTTPS from an aiohttp server. Each scenario runs on asyncio's own event loop and on
uvloop, the loop the daemon runs on. Covered: keep-alive reuse and expiry, `Connection: close`, interim 1xx
answers, chunked and close-delimited bodies, the body cap, endless bodies and heads, garbage, closes and
resets, refused connections, the deadline, cancellation, `close()`, HTTPS, and `parse_url`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from aiohttp import web

from jobcar.executors.http_client import (
    MAX_HEAD_BYTES,
    BadResponse,
    ConnectFailed,
    ConnectionClosed,
    HttpClient,
    Origin,
    RequestFailed,
    Response,
    Target,
    parse_url,
)
from tests.servers import free_port

#: How long a test waits for something that should happen at once (a server noticing a close, say).
WAIT_S = 2.0
#: A deadline far enough away never to be the reason a request ends.
FAR_S = 10.0
#: "Promptly": a request ended by the client's own checks, not by a deadline FAR_S away.
PROMPT_S = 2.0
LIMIT = 1000
PATTERN = bytes(range(256)) * 256  # 64 KiB of every byte value


# -- event loops --------------------------------------------------------------------------------------------


#: Runs a test on a fresh loop of each kind (the daemon uses uvloop when installed): see tests/conftest.py.
BOTH_LOOPS = pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])


# -- waiting ------------------------------------------------------------------------------------------------


async def eventually(condition: Callable[[], object], what: str, seconds: float = WAIT_S) -> None:
    """Poll `condition` until it holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        await asyncio.sleep(0.002)


async def within(event: asyncio.Event, what: str, seconds: float = WAIT_S) -> None:
    """Wait for `event`; fail naming `what` after `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"timed out after {seconds}s waiting for {what}") from None


# -- the raw server ---------------------------------------------------------------------------------------------


@dataclass
class Request:
    head: bytes  # request line to the blank line, inclusive
    body: bytes


@dataclass(eq=False)
class Connection:
    """One accepted TCP connection, as the server sees it."""

    number: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: The server's event, set whenever any of its connections has read a request.
    got_request: asyncio.Event
    requests: list[Request] = field(default_factory=list)
    #: Set once the server has seen the client go: EOF, a reset, or a write that failed.
    client_left: asyncio.Event = field(default_factory=asyncio.Event)

    async def read_request(self) -> Request | None:
        """The next request on this connection, None once the client has closed or reset it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.client_left.set()
            return None
        request = Request(head, body)
        self.requests.append(request)
        self.got_request.set()
        return request

    async def until_client_leaves(self) -> None:
        """Read (and drop) whatever comes until the client closes or resets the connection."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        self.client_left.set()

    async def send(self, *pieces: bytes) -> None:
        """Write each piece on its own, waiting for the socket to take it."""
        for piece in pieces:
            self.writer.write(piece)
            await self.writer.drain()

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), as a crashed handler or a load balancer dropping the flow would."""
        sock = self.writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


#: What the server does with one accepted connection; when it returns, the server closes the connection.
Script = Callable[[Connection], Awaitable[None]]


class RawServer:
    """A TCP server on a free loopback port running `script` on every connection it accepts."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections: list[Connection] = []
        self.got_request = asyncio.Event()
        self._errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def accepted(self) -> int:
        return len(self.connections)

    @property
    def origin(self) -> Origin:
        assert self._server is not None
        return Origin("127.0.0.1", self._server.sockets[0].getsockname()[1], tls=False)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for connection in self.connections:
            connection.writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        if exc is None:
            assert not self._errors, f"the server's script failed: {self._errors!r}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = Connection(self.accepted + 1, reader, writer, self.got_request)
        self.connections.append(connection)
        try:
            await self.script(connection)
        except (ConnectionError, asyncio.IncompleteReadError):
            connection.client_left.set()  # a write or a read failed: the client is gone
        except asyncio.CancelledError:
            pass  # torn down by __aexit__
        except Exception as exc:
            self._errors.append(exc)
        finally:
            writer.close()
            self._tasks.discard(task)


def answer(status: int = 200, body: bytes = b"ok", *headers: str) -> bytes:
    """A whole response with a Content-Length; `headers` as "Name: value"."""
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answering(reply: bytes) -> Script:
    """Answer every request with `reply`, keeping the connection open until the client leaves."""

    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(reply)

    return script


async def never_answering(connection: Connection) -> None:
    await connection.read_request()
    await connection.until_client_leaves()


# -- the client side ------------------------------------------------------------------------------------------


def request_head(body: bytes, path: str = "/jobs", host: str = "127.0.0.1") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode()


async def post(
    client: HttpClient, origin: Origin, body: bytes = b'{"n": 1}', *, limit: int = LIMIT, within_s: float = FAR_S
) -> Response:
    deadline = asyncio.get_running_loop().time() + within_s
    return await client.post(origin, request_head(body), body, limit, deadline)


@contextlib.asynccontextmanager
async def http_client(**options: Any) -> AsyncIterator[HttpClient]:
    client = HttpClient(**options)
    try:
        yield client
    finally:
        await client.close()


async def post_expecting(exception: type[BaseException], script: Script) -> float:
    """One post to a server running `script`, which must raise `exception` and drop the connection; how long
    the post took."""
    async with RawServer(script) as server, http_client() as client:
        started = time.monotonic()
        with pytest.raises(exception):
            await post(client, server.origin)
        elapsed = time.monotonic() - started
        [connection] = server.connections
        await within(connection.client_left, "the server to see the client drop the connection")
    return elapsed


# -- 1. keep-alive ---------------------------------------------------------------------------------------------


@BOTH_LOOPS
async def test_sequential_posts_reuse_one_keep_alive_connection() -> None:
    reply = answer(201, b'{"id": 7}', "Content-Type: application/json", "X-Dup: one", "x-dup: two")

    async with RawServer(answering(reply)) as server, http_client() as client:
        first = await post(client, server.origin, b"first")
        second = await post(client, server.origin, b"second")
        assert server.accepted == 1, "the second post must reuse the first one's connection"
        [connection] = server.connections
        assert [r.body for r in connection.requests] == [b"first", b"second"]
        assert connection.requests[0].head == request_head(b"first"), "the head goes out byte for byte"
        for response in (first, second):
            assert (response.status, response.reason, response.body) == (201, "Created", b'{"id": 7}')
            assert response.truncated is False
            assert response.header("content-type") == "application/json", "names compare case-insensitively"
            assert response.header("X-Dup") == "two", "the last value of a repeated header"
            assert response.header("X-Absent") is None


@BOTH_LOOPS
async def test_a_connection_close_answer_is_not_reused() -> None:
    # The server keeps the connection open after saying `Connection: close`: the client must honour the header
    # itself, not merely notice a FIN.
    async with RawServer(answering(answer(200, b"bye", "Connection: close"))) as server, http_client() as client:
        assert (await post(client, server.origin)).body == b"bye"
        assert (await post(client, server.origin)).body == b"bye"
        assert server.accepted == 2, "a `Connection: close` answer ends the connection's use"


@BOTH_LOOPS
async def test_the_client_closes_a_connection_the_server_answered_with_connection_close() -> None:
    """RFC 9112 §9.6: a client that receives `close` MUST close the connection after reading the response.
    A server that does not close its side (misbehaving, or slow to) must not leave the socket open forever."""

    async with RawServer(answering(answer(200, b"bye", "Connection: close"))) as server, http_client() as client:
        assert (await post(client, server.origin)).body == b"bye"
        [connection] = server.connections
        await within(connection.client_left, "the client to close the connection it will not reuse")


# -- 2. interim answers -----------------------------------------------------------------------------------------

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"
FINAL = answer(200, b"done", "X-Final: yes")


INTERIM = {
    "100": (CONTINUE, FINAL),
    "103": (EARLY_HINTS, FINAL),
    "100-then-103": (CONTINUE, EARLY_HINTS, FINAL),
    "all-in-one-write": (CONTINUE + EARLY_HINTS + FINAL,),
    "final-head-split": (CONTINUE + FINAL[:20], FINAL[20:]),
}


@pytest.mark.parametrize("case", list(INTERIM))
@BOTH_LOOPS
async def test_interim_1xx_answers_are_skipped(case: str) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(*INTERIM[case])  # each piece in its own write
        await answering(answer(200, b"again"))(connection)

    async with RawServer(script) as server, http_client() as client:
        response = await post(client, server.origin)
        assert (response.status, response.reason, response.body) == (200, "OK", b"done")
        assert response.header("X-Final") == "yes"
        assert response.header("Link") is None, "only the final answer's headers"
        again = await post(client, server.origin)
        assert (again.status, again.body, server.accepted) == (200, b"again", 1), "the connection stays usable"


# -- 3. body framing ----------------------------------------------------------------------------------------------


@BOTH_LOOPS
async def test_a_chunked_body_is_returned_whole() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
    chunks = (b"5\r\nhello\r\n", b"1\r\n \r\n", b"a;ext=1\r\n0123456789\r\n", b"0\r\n\r\n")

    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(head, *chunks)

    async with RawServer(script) as server, http_client() as client:
        for _ in range(2):
            response = await post(client, server.origin)
            assert (response.status, response.body, response.truncated) == (200, b"hello 0123456789", False)
        assert server.accepted == 1, "a chunked answer ends with its last chunk: the connection is reused"


@BOTH_LOOPS
async def test_a_body_without_length_ends_when_the_server_closes() -> None:
    body = PATTERN * 2  # 128 KiB, sent in pieces

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n")
        await connection.send(*(body[i : i + 10_000] for i in range(0, len(body), 10_000)))
        # returning closes the connection: the end of the body

    async with RawServer(script) as server, http_client() as client:
        response = await post(client, server.origin, limit=len(body))
        assert (response.status, response.truncated) == (200, False)
        assert response.body == body
        await post(client, server.origin, limit=len(body))
        assert server.accepted == 2, "a connection whose end was the body's end is not reused"


@BOTH_LOOPS
async def test_a_large_request_body_arrives_whole() -> None:
    big = PATTERN * 16  # 1 MiB: above the size that is joined to the head, so written on its own

    async def script(connection: Connection) -> None:
        while (request := await connection.read_request()) is not None:
            await connection.send(answer(200, hashlib.sha256(request.body).hexdigest().encode()))

    async with RawServer(script) as server, http_client() as client:
        for body in (big, b"small", big[:20_000]):
            response = await post(client, server.origin, body, limit=100)
            assert response.body == hashlib.sha256(body).hexdigest().encode()
        assert server.accepted == 1


# -- 4. the body cap ---------------------------------------------------------------------------------------------


@BOTH_LOOPS
async def test_a_body_longer_than_the_limit_is_cut_and_its_connection_dropped() -> None:
    async with RawServer(answering(answer(200, PATTERN[:10_000]))) as server, http_client() as client:
        response = await post(client, server.origin, limit=LIMIT)
        assert (response.status, response.truncated) == (200, True)
        assert response.body == PATTERN[:LIMIT]
        await within(server.connections[0].client_left, "the client to drop the connection mid-body")
        again = await post(client, server.origin, limit=LIMIT)
        assert again.truncated
        assert server.accepted == 2, "the cut connection is never reused"


@BOTH_LOOPS
async def test_a_body_of_exactly_the_limit_is_whole_and_its_connection_kept() -> None:
    async with RawServer(answering(answer(200, PATTERN[:LIMIT]))) as server, http_client() as client:
        for _ in range(2):
            response = await post(client, server.origin, limit=LIMIT)
            assert (response.body, response.truncated) == (PATTERN[:LIMIT], False)
        assert server.accepted == 1


ENDLESS_HEADS = {
    "close-delimited": b"HTTP/1.1 200 OK\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    "content-length-1GiB": b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n",
}


@pytest.mark.parametrize("framing", sorted(ENDLESS_HEADS))
@BOTH_LOOPS
async def test_an_endless_body_returns_promptly_truncated(framing: str) -> None:
    piece = b"10000\r\n" + PATTERN + b"\r\n" if framing == "chunked" else PATTERN

    async def endless(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(ENDLESS_HEADS[framing])
        while True:
            await connection.send(piece)

    async with RawServer(endless) as server, http_client() as client:
        started = time.monotonic()
        response = await post(client, server.origin, limit=100_000)
        elapsed = time.monotonic() - started
        assert (response.status, response.truncated, len(response.body)) == (200, True, 100_000)
        assert response.body == PATTERN + PATTERN[: 100_000 - len(PATTERN)]
        assert elapsed < PROMPT_S, elapsed
        await within(server.connections[0].client_left, "the client to hang up on the endless body")


# -- 5. and 6. heads that are not HTTP or too long --------------------------------------------------------


@BOTH_LOOPS
async def test_an_endless_response_head_is_refused() -> None:
    filler = b"".join(b"X-Filler-%d: %s\r\n" % (n, b"a" * 200) for n in range(300))  # about 64 KiB a write

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(b"HTTP/1.1 200 OK\r\n")
        while True:
            await connection.send(filler)

    elapsed = await post_expecting(BadResponse, script)
    assert elapsed < PROMPT_S, elapsed


@BOTH_LOOPS
async def test_a_head_just_under_the_cap_is_read_even_with_a_big_body_in_the_same_write() -> None:
    headers = [f"X-Filler-{n}: {'b' * 100}" for n in range((MAX_HEAD_BYTES - 2048) // 115)]
    reply = answer(200, PATTERN * 2, *headers)  # one write: the end of the head and 128 KiB of body in one read
    head_size = reply.index(b"\r\n\r\n") + 4
    assert MAX_HEAD_BYTES - 4096 < head_size <= MAX_HEAD_BYTES, head_size

    async with RawServer(answering(reply)) as server, http_client() as client:
        response = await post(client, server.origin, limit=len(PATTERN) * 2)
        assert (response.status, response.body, response.truncated) == (200, PATTERN * 2, False)
        assert response.header("X-Filler-0") == "b" * 100


GARBAGE = {
    "ssh-banner": b"SSH-2.0-OpenSSH_9.6\r\n",
    "tls-alert": b"\x15\x03\x01\x00\x02\x02\x46",
    "bad-status": b"HTTP/1.1 2xx OK\r\n\r\n",
    "bad-header": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
}


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
@BOTH_LOOPS
async def test_garbage_instead_of_http_is_a_bad_response(garbage: str) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(GARBAGE[garbage])
        await connection.until_client_leaves()  # like a real SSH server: wait for more from the client

    elapsed = await post_expecting(BadResponse, script)
    assert elapsed < PROMPT_S, elapsed


# -- 7. closes and resets ---------------------------------------------------------------------------------------


async def close_before_answering(connection: Connection) -> None:
    await connection.read_request()


async def reset_before_answering(connection: Connection) -> None:
    await connection.read_request()
    connection.reset()


async def close_mid_head(connection: Connection) -> None:
    await connection.read_request()
    await connection.send(b"HTTP/1.1 200 OK\r\nContent-Le")


async def close_mid_body(connection: Connection) -> None:
    await connection.read_request()
    await connection.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)


async def reset_mid_body(connection: Connection) -> None:
    await connection.read_request()
    await connection.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
    connection.reset()


async def close_mid_chunked_body(connection: Connection) -> None:
    await connection.read_request()
    await connection.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")


@pytest.mark.parametrize(
    "ending",
    [close_before_answering, reset_before_answering, close_mid_head, close_mid_body, reset_mid_body,
     close_mid_chunked_body],
    ids=lambda script: script.__name__,
)  # fmt: skip
@BOTH_LOOPS
async def test_a_connection_ended_before_a_complete_answer_is_connection_closed(ending: Script) -> None:
    async with RawServer(ending) as server, http_client() as client:
        started = time.monotonic()
        with pytest.raises(ConnectionClosed):
            await post(client, server.origin)
        elapsed = time.monotonic() - started
    assert elapsed < PROMPT_S, elapsed


@BOTH_LOOPS
async def test_a_reset_in_a_close_delimited_body_is_not_a_complete_answer() -> None:
    """A body without Content-Length or chunking ends with the connection, but only a clean close (FIN) ends it:
    a reset (RST) means the answer was cut short, so taking it as complete would pass a truncated body off as
    the handler's whole result."""

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"partial " * 100)
        connection.reset()

    async with RawServer(script) as server, http_client() as client:
        try:
            response = await post(client, server.origin)
        except ConnectionClosed:
            return
        pytest.fail(f"a reset body taken as complete: {response.status}, {len(response.body)} bytes")


@BOTH_LOOPS
async def test_a_server_that_hangs_up_at_once_fails_the_request_cleanly() -> None:
    """A server at its connection limit may accept and close at once, before the request is even written."""

    async def hang_up(connection: Connection) -> None:
        return

    async with RawServer(hang_up) as server, http_client() as client:
        with pytest.raises(ConnectionClosed):
            await post(client, server.origin, within_s=PROMPT_S)


@BOTH_LOOPS
async def test_a_server_that_speaks_first_fails_the_request_cleanly() -> None:
    """An SSH server (or SMTP, MySQL, …) on the handler's port sends its banner on accept, before any request."""

    async def banner(connection: Connection) -> None:
        await connection.send(GARBAGE["ssh-banner"])
        await connection.until_client_leaves()

    async with RawServer(banner) as server, http_client() as client:
        with pytest.raises(RequestFailed):
            await post(client, server.origin, within_s=PROMPT_S)


@BOTH_LOOPS
async def test_extra_bytes_after_a_complete_answer_do_not_leak_into_it() -> None:
    """Bytes after the end of an answer answer no request: they must not change the answer already returned,
    and (as data_received says) a connection that carried them is not reused."""
    first = answer(200, b"first", "X-Which: first")
    stray = answer(500, b"stray", "X-Which: stray")

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(first + stray)  # one write: both land in one read
        await answering(answer(200, b"next"))(connection)

    async with RawServer(script) as server, http_client() as client:
        response = await post(client, server.origin)
        seen = (response.status, response.body, response.header("X-Which"))
        await post(client, server.origin)  # on a new connection, where the script starts over
        assert (seen, server.accepted) == ((200, b"first", "first"), 2)


@BOTH_LOOPS
async def test_a_server_closing_right_after_its_answer_fails_the_next_request_cleanly() -> None:
    """A server that closes after answering without saying `Connection: close` (a restart, a keep-alive timeout
    racing the answer): the next post may succeed on a new connection or fail with RequestFailed, but nothing
    else may escape (the executor maps only TimeoutError and RequestFailed)."""

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(answer(200, b"one"))

    async with RawServer(script) as server, http_client() as client:
        assert (await post(client, server.origin)).body == b"one"
        try:
            again = await post(client, server.origin, within_s=PROMPT_S)
        except RequestFailed:
            return
        assert again.body == b"one"


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@BOTH_LOOPS
async def test_a_post_racing_the_servers_close_of_an_idle_connection_fails_cleanly(reset: bool) -> None:
    """The keep-alive race: the server closes an idle connection just as the client picks it for a post.
    The post may fail (RequestFailed: the job's failed attempt) or succeed on a new connection, but nothing
    else may escape: the executor maps only TimeoutError and RequestFailed. The post is started at each
    loop iteration of the close in turn (0 to 5 iterations after the server's close), one round each."""
    hang_ups: list[asyncio.Event] = []

    async def script(connection: Connection) -> None:
        request = await connection.read_request()
        if request is None:
            return
        if request.body == b"first":
            hang_up = asyncio.Event()
            hang_ups.append(hang_up)
            await connection.send(answer(200, b"first"))
            await hang_up.wait()
            if reset:
                connection.reset()
            return  # the connection closes
        await connection.send(answer(200, b"second"))
        await answering(answer(200, b"second"))(connection)

    async with RawServer(script) as server:
        for spins in range(6):
            async with http_client() as client:
                await post(client, server.origin, b"first")
                hang_ups[-1].set()
                for _ in range(spins):
                    await asyncio.sleep(0)  # one loop iteration further into the close, not a wait
                try:
                    response = await post(client, server.origin, b"second", within_s=PROMPT_S)
                except RequestFailed:
                    continue  # the job's failed attempt: fine
                assert response.body == b"second", spins


# -- 8. refused --------------------------------------------------------------------------------------------------


@BOTH_LOOPS
async def test_a_refused_connection_is_connect_failed() -> None:
    async with http_client() as client:
        with pytest.raises(ConnectFailed, match=r"127\.0\.0\.1"):
            await post(client, Origin("127.0.0.1", free_port(), tls=False))


# -- 9. and 10. the deadline and cancellation ------------------------------------------------------------------


async def dripping(connection: Connection) -> None:
    """A head promising 1000 bytes, then one byte every 20 ms: never idle for long, never done in time."""
    await connection.read_request()
    await connection.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        await connection.send(b"x")
        await asyncio.sleep(0.02)  # the drip's pace, not a wait for a result


@pytest.mark.parametrize("script", [never_answering, dripping], ids=lambda script: script.__name__)
@BOTH_LOOPS
async def test_the_deadline_ends_the_request_with_timeout_error(script: Script) -> None:
    budget = 0.3
    loop = asyncio.get_running_loop()
    async with RawServer(script) as server, http_client() as client:
        deadline = loop.time() + budget
        with pytest.raises(TimeoutError):
            await client.post(server.origin, request_head(b"{}"), b"{}", LIMIT, deadline)
        ended = loop.time()
        await within(server.connections[0].client_left, "the server to see the timed-out connection closed")
    # uvloop's timers tick in whole milliseconds: allow one tick early, nothing more.
    assert deadline - 0.001 <= ended < deadline + PROMPT_S, ended - deadline


@BOTH_LOOPS
async def test_a_deadline_already_passed_fails_at_once() -> None:
    async with RawServer(answering(answer())) as server, http_client() as client:
        await post(client, server.origin)  # an idle connection to reuse: no connect to time out
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await post(client, server.origin, within_s=-1)
        assert time.monotonic() - started < PROMPT_S
        assert (await post(client, server.origin)).body == b"ok", "the client is fine afterwards"


@BOTH_LOOPS
async def test_cancelling_a_post_mid_request_closes_its_connection() -> None:
    async with RawServer(never_answering) as server, http_client() as client:
        task = asyncio.create_task(post(client, server.origin))
        await within(server.got_request, "the request to reach the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await within(server.connections[0].client_left, "the server to see the cancelled request's connection go")


@BOTH_LOOPS
async def test_closing_the_client_fails_busy_requests_and_closes_idle_connections() -> None:
    async with RawServer(never_answering) as busy, RawServer(answering(answer())) as idle:
        client = HttpClient()
        try:
            await post(client, idle.origin)
            task = asyncio.create_task(post(client, busy.origin))
            await within(busy.got_request, "the busy request to reach its server")
        finally:
            await client.close()
        with pytest.raises(ConnectionClosed):
            await task
        await within(busy.connections[0].client_left, "the busy connection to be closed")
        await within(idle.connections[0].client_left, "the idle connection to be closed")


# -- 11. and 12. idle connections -------------------------------------------------------------------------------


@pytest.mark.parametrize("goodbye", [b"", b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"],
                         ids=["fin", "408-then-fin"])  # fmt: skip
@BOTH_LOOPS
async def test_an_idle_connection_the_server_closed_is_not_reused(goodbye: bytes) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(answer(200, b"first"))
        if connection.number == 1:
            # Idle timeout: close our side (with a parting 408, as some servers send), then wait for the
            # client to close its own: once it has, it has seen the close.
            await connection.send(goodbye)
            connection.writer.write_eof()
            await connection.until_client_leaves()
        else:
            await answering(answer(200, b"second"))(connection)

    async with RawServer(script) as server, http_client() as client:
        assert (await post(client, server.origin)).body == b"first"
        await within(server.connections[0].client_left, "the client to notice the server's close")
        response = await post(client, server.origin)
        assert (response.status, server.accepted) == (200, 2)


@BOTH_LOOPS
async def test_a_closed_idle_connection_is_skipped_for_a_live_one() -> None:
    """Two idle connections; the server closes the warmest one (the one the client would pick first)."""
    second_answered = asyncio.Event()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        if connection.number == 1:
            await within(second_answered, "the second connection to answer first")
            await connection.send(answer(200, b"one"))
            connection.writer.write_eof()
            await connection.until_client_leaves()
        else:
            await connection.send(answer(200, b"two"))
            second_answered.set()
            await answering(answer(200, b"two"))(connection)

    async with RawServer(script) as server, http_client() as client:
        first = asyncio.create_task(post(client, server.origin))
        await within(server.got_request, "the first request to reach the server")
        assert (await post(client, server.origin)).body == b"two", "the first connection is busy: a second one"
        assert (await first).body == b"one"
        await within(server.connections[0].client_left, "the client to notice the server's close")
        response = await post(client, server.origin, within_s=PROMPT_S)
        assert (response.body, server.accepted) == (b"two", 2), "the live idle connection is reused"


@BOTH_LOOPS
async def test_an_idle_connection_older_than_keepalive_is_replaced() -> None:
    keepalive = 0.2

    async with RawServer(answering(answer())) as server, http_client(keepalive=keepalive) as client:
        await post(client, server.origin)
        await post(client, server.origin)
        idle_from = time.monotonic()
        assert server.accepted == 1, "within keepalive, the connection is reused"
        await eventually(lambda: time.monotonic() - idle_from > keepalive, "the connection to be idle too long")
        await post(client, server.origin)
        assert server.accepted == 2, "past keepalive, a new connection"
        await within(server.connections[0].client_left, "the client to close the expired connection")


# -- 13. HTTPS --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1, made once for the module: (certificate, key)."""
    directory = tmp_path_factory.mktemp("tls")
    done = subprocess.run(
        ["openssl", "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        cwd=directory, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return directory / "cert.pem", directory / "key.pem"


@contextlib.asynccontextmanager
async def https_server(certificate: tuple[Path, Path]) -> AsyncIterator[int]:
    """An aiohttp server speaking only TLS on a free loopback port; answers POST /x with the body's length."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=f"secure {len(await request.read())}")

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    app = web.Application()
    app.router.add_post("/x", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def post_to(client: HttpClient, target: Target, body: bytes) -> Response:
    head = f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\nContent-Length: {len(body)}\r\n\r\n"
    deadline = asyncio.get_running_loop().time() + FAR_S
    return await client.post(target.origin, head.encode(), body, LIMIT, deadline)


@BOTH_LOOPS
async def test_https_with_a_context_trusting_the_certificate(certificate: tuple[Path, Path]) -> None:
    trusting = ssl.create_default_context(cafile=str(certificate[0]))
    async with https_server(certificate) as port, http_client(ssl_context=trusting) as client:
        target = parse_url(f"https://localhost:{port}/x")
        assert target.origin == Origin("localhost", port, tls=True)
        for body in (b"hello", PATTERN):
            response = await post_to(client, target, body)
            assert (response.status, response.body) == (200, f"secure {len(body)}".encode())


@BOTH_LOOPS
async def test_https_with_the_default_context_refuses_a_self_signed_certificate(certificate: tuple[Path, Path]) -> None:
    async with https_server(certificate) as port, http_client() as client:
        with pytest.raises(ConnectFailed, match=r"(?i)certificate verify failed"):
            await post_to(client, parse_url(f"https://localhost:{port}/x"), b"hello")


# -- 14. parse_url ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin", "host_header", "path"),
    [
        ("http://example.com", Origin("example.com", 80, False), "example.com", "/"),
        ("https://example.com/jobs", Origin("example.com", 443, True), "example.com", "/jobs"),
        ("http://example.com:80/a", Origin("example.com", 80, False), "example.com", "/a"),
        ("https://example.com:443/a", Origin("example.com", 443, True), "example.com", "/a"),
        ("http://example.com:8080/a", Origin("example.com", 8080, False), "example.com:8080", "/a"),
        ("https://example.com:80/a", Origin("example.com", 80, True), "example.com:80", "/a"),
        ("http://[::1]:8080/a?b=1", Origin("::1", 8080, False), "[::1]:8080", "/a?b=1"),
        ("https://[2001:db8::1]/", Origin("2001:db8::1", 443, True), "[2001:db8::1]", "/"),
        ("http://127.0.0.1:9000?x=1&y=%20", Origin("127.0.0.1", 9000, False), "127.0.0.1:9000", "/?x=1&y=%20"),
        ("http://example.com/a/b%2Fc#fragment", Origin("example.com", 80, False), "example.com", "/a/b%2Fc"),
        ("HTTP://Example.COM/Path", Origin("example.com", 80, False), "example.com", "/Path"),
    ],
)
def test_parse_url(url: str, origin: Origin, host_header: str, path: str) -> None:
    target = parse_url(url)
    assert (target.origin, target.host_header, target.path, target.authorization) == (origin, host_header, path, None)


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


@pytest.mark.parametrize(
    ("url", "credentials"),
    [("http://alice:s3cret@example.com:8080/x", "alice:s3cret"), ("https://alice@example.com/", "alice:")],
)
def test_parse_url_turns_user_and_password_into_basic_authorization(url: str, credentials: str) -> None:
    target = parse_url(url)
    assert target.authorization == basic(credentials)
    assert "alice" not in target.host_header
    assert "@" not in target.host_header


def test_parse_url_percent_decodes_user_and_password() -> None:
    """RFC 3986 userinfo is percent-encoded; Basic credentials are the decoded text, as aiohttp (the client
    before this one) sent them: `p%40ss` is the password `p@ss`."""
    target = parse_url("http://alice%40corp:p%40ss%3Aword@example.com/")
    assert target.authorization == basic("alice@corp:p@ss:word")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/", "not an http"),
        ("unix:///run/handler.sock", "not an http"),
        ("example.com/jobs", "not an http"),
        ("http:///jobs", "not an http"),
        ("", "not an http"),
        ("http://example.com:99999/", "(?i)port"),
        ("http://example.com:port/", "(?i)port"),
    ],
)
def test_parse_url_refuses_what_is_not_an_http_url(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_url(url)
