"""A small asyncio TCP fault proxy for tests on one machine (there is no toxiproxy here).

`FaultProxy(target_host, target_port)` listens on 127.0.0.1 on a free port and forwards every
connection to the target. Its event loop runs in a daemon thread, so synchronous tests use it like
any server::

    with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        client = redis.Redis.from_url(proxy.url_for_redis())
        proxy.latency = 0.2          # knobs can change at any time, from any thread
        proxy.blackhole = True
        proxy.reset()

Faults, and the real failure each one imitates:

- `latency` (seconds) and `jitter` (uniform extra seconds): every chunk read from one side is
  delivered that much later to the other, in each direction, without limiting throughput and
  without reordering. A slow or far network, a congested link, a server across regions. With a
  client that cancels or times out, it reproduces the redis-py cancellation bug class
  (CVE-2023-28858/9): a reply still in flight must never be delivered to the next command.
- `blackhole`: connections are accepted and read, but nothing is forwarded in either direction;
  the bytes read meanwhile are dropped. A network partition, a firewall or NAT that silently drops a
  flow, a server host that froze: no error, no RST, the peer just never answers, and only timeouts
  notice. A command sent during the blackhole never gets its reply, even after it is lifted.
- `reset()`: every open connection is closed with a TCP RST (SO_LINGER 0 before close), both the
  client's and the upstream side. A server restart or failover, a load balancer or a NAT dropping
  its state, a peer crashing: the next read or write fails with "connection reset".
- `refuse`: new connections are closed (RST) as soon as they are accepted. A server that is down or
  restarting, a port with nothing behind it, a full accept queue.
- `data_limit` (bytes, both directions together, per connection): after that many bytes the
  connection is reset, the last chunk forwarded only up to the limit. A connection cut in the middle
  of a command or a reply: a half-written request, a truncated response.
- `slice_size` (bytes): data is forwarded in slices of at most N bytes, each flushed on its own
  (TCP_NODELAY). A reply split over many small segments: it proves a parser reassembles frames and
  never assumes one read is one message.

Counters (`connections`, `bytes_up` client→server, `bytes_down` server→client, `resets`, `open`)
count what the proxy read, whether or not it forwarded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

_RESET = object()  # queue sentinel: reset the connection once everything before it is written
_EOF = object()  # queue sentinel: the reading side closed; half-close the writing side
_CHUNK = 65536


def _linger_zero(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    forwarded: int = 0  # bytes accepted for forwarding, both directions (for data_limit)
    killed: bool = False

    def kill(self) -> None:
        """RST both sides and stop the pumps (on the proxy's loop)."""
        if self.killed:
            return
        self.killed = True
        for writer in (self.client, self.upstream):
            _linger_zero(writer)
            writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class FaultProxy:
    """A TCP proxy to `target_host:target_port` with faults switchable at any time (see the module doc)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        # Knobs: plain attributes, read by the proxy loop for every chunk or connection, so setting
        # one from any thread takes effect at once (attribute assignment is atomic).
        self.latency = 0.0
        self.jitter = 0.0
        self.blackhole = False
        self.refuse = False
        self.data_limit: int | None = None
        self.slice_size: int | None = None
        self._lock = threading.Lock()
        self._connections_accepted = 0
        self._bytes_up = 0
        self._bytes_down = 0
        self._resets = 0
        self._open: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self.port = 0

    # --- counters -------------------------------------------------------------------------------

    @property
    def connections(self) -> int:
        """Connections accepted so far (refused ones included)."""
        with self._lock:
            return self._connections_accepted

    @property
    def bytes_up(self) -> int:
        """Bytes read from clients (client → server)."""
        with self._lock:
            return self._bytes_up

    @property
    def bytes_down(self) -> int:
        """Bytes read from the target (server → client)."""
        with self._lock:
            return self._bytes_down

    @property
    def resets(self) -> int:
        """Connections the proxy closed with RST (reset(), refuse, data_limit)."""
        with self._lock:
            return self._resets

    @property
    def open(self) -> int:
        """Connections currently proxied."""
        with self._lock:
            return len(self._open)

    def url_for_redis(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        if self._loop is not None:
            raise RuntimeError("already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"faultproxy->{self.target_port}", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and join its thread. Idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not loop.is_running():
            loop.close()
        self._loop = self._thread = None

    def reset(self) -> int:
        """RST every open connection now; returns how many. New connections are unaffected."""
        if self._loop is None:
            return 0
        return asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- on the proxy's loop --------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _reset_all(self) -> int:
        with self._lock:
            connections = list(self._open)
            self._resets += len(connections)
        for conn in connections:
            conn.kill()
        return len(connections)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        with self._lock:
            connections = list(self._open)
        for conn in connections:
            conn.kill()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _count(self, direction: str, n: int) -> None:
        with self._lock:
            if direction == "up":
                self._bytes_up += n
            else:
                self._bytes_down += n

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        with self._lock:
            self._connections_accepted += 1
        conn: _Connection | None = None
        try:
            if self.refuse:
                with self._lock:
                    self._resets += 1
                _linger_zero(writer)
                writer.transport.abort()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                _linger_zero(writer)
                writer.transport.abort()
                return
            conn = _Connection(writer, up_writer)
            _nodelay(writer)
            _nodelay(up_writer)
            with self._lock:
                self._open.add(conn)
            up: asyncio.Queue[tuple[float, object]] = asyncio.Queue()
            down: asyncio.Queue[tuple[float, object]] = asyncio.Queue()
            conn.tasks = [
                asyncio.create_task(self._read(conn, reader, up, "up")),
                asyncio.create_task(self._write(conn, up_writer, up)),
                asyncio.create_task(self._read(conn, up_reader, down, "down")),
                asyncio.create_task(self._write(conn, writer, down)),
            ]
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            if conn is not None:
                with self._lock:
                    self._open.discard(conn)
                for w in (conn.client, conn.upstream):
                    if conn.killed:
                        w.transport.abort()
                    else:
                        w.close()
                for t in conn.tasks:
                    t.cancel()
                await asyncio.gather(*conn.tasks, return_exceptions=True)
            self._handlers.discard(task)

    async def _read(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, object]],
        direction: str,
    ) -> None:
        """Read chunks and queue them with their due time; drop them while blackholed."""
        last_due = 0.0
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    queue.put_nowait((last_due, _EOF))
                    return
                self._count(direction, len(data))
                if self.blackhole:
                    continue
                limit = self.data_limit
                cut = False
                if limit is not None and conn.forwarded + len(data) >= limit:
                    data, cut = data[: max(0, limit - conn.forwarded)], True
                conn.forwarded += len(data)
                delay = self.latency + (random.uniform(0, self.jitter) if self.jitter > 0 else 0.0)
                last_due = max(last_due, time.monotonic() + delay)  # never reorder
                if data:
                    queue.put_nowait((last_due, data))
                if cut:
                    queue.put_nowait((last_due, _RESET))
                    return
        except (ConnectionError, OSError):
            conn.kill()

    async def _write(
        self, conn: _Connection, writer: asyncio.StreamWriter, queue: asyncio.Queue[tuple[float, object]]
    ) -> None:
        """Deliver queued chunks at their due time, in slices if asked."""
        try:
            while True:
                due, item = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if item is _EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if item is _RESET:
                    with self._lock:
                        self._resets += 1
                    conn.kill()
                    return
                assert isinstance(item, bytes)
                step = self.slice_size or len(item)
                for start in range(0, len(item), step):
                    writer.write(item[start : start + step])
                    await writer.drain()
        except (ConnectionError, OSError):
            conn.kill()
