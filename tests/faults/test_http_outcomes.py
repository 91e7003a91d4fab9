"""Every HTTP outcome in one run of a real `jobcar run` (guarantee 11 of docs/delivery-semantics.md), end to end.

One daemon, one handler server that misbehaves at the byte level (a raw asyncio HTTP/1.1 server with
keep-alive: a status line, headers and a body written by hand, a reset with SO_LINGER 0, a body dripped one
byte at a time, an endless body), and a FaultProxy in front of one route. The executor's mapping of each
answer is unit-tested in tests/integration/test_http_executor.py; here the same answers go through the whole
daemon at once: leasing, backoff, Retry-After snoozes, the dead-letter queue, the deadline and the shared
keep-alive pool, measured from the outside (the server's clock, the daemon's /proc sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import os
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from jobcar import State
from jobcar.job import Job
from tests.faultproxy import FaultProxy
from tests.integration.daemon_harness import DaemonProcess, wait_state, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for

#: Jobs running at once in the daemon: also the most keep-alive connections it may hold to one handler.
CONCURRENCY = 8
DRIP_TIMEOUT = 1.0
#: How far past its timeout an attempt may end (event loop wake-up, closing the connection, the server noticing).
DEADLINE_MARGIN = 0.5
RETRY_AFTER = 7
RESPONSE_CAP = 1024  # the big body handler's max_response_bytes, 1KiB
FAIL_BACKOFF = {"base": "400ms", "max": "800ms"}
#: A body far bigger than the cap: if the daemon read (or drained) it all, the server would write all of it.
BIG_BODY = 1024 * 1024 * 1024
PATTERN = bytes(range(256)) * 256  # 64 KiB, written again and again for the big body


@dataclass
class Hit:
    """One request as the server read it."""

    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    connection: int  # the server's number for the TCP connection it came on
    at: float = field(default_factory=time.monotonic)

    @property
    def job_id(self) -> str:
        return self.headers["jobcar-job-id"]

    @property
    def attempt(self) -> int:
        return int(self.headers["jobcar-attempt"])


@dataclass
class Ending:
    """How the client ended a connection that a route kept busy (a drip, an endless body, a held request)."""

    hit: Hit
    closed_at: float
    bytes_sent: int

    @property
    def duration(self) -> float:
        return self.closed_at - self.hit.at


#: A route answers one request; it returns whether the connection stays open for the next one (keep-alive).
Route = Callable[[Hit, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", f"Content-Length: {len(body)}"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): a crashed or killed handler, a load balancer dropping the flow."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class RawHttpServer:
    """An HTTP/1.1 handler on 127.0.0.1 written on asyncio streams, its loop in a daemon thread.

    Requests on one connection are answered in turn (keep-alive) until a route says otherwise or the client
    closes. Every request is recorded as a Hit; routes that hold a connection record how it ended.
    """

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self._lock = threading.Lock()
        self._hits: list[Hit] = []
        self._endings: list[Ending] = []
        self.accepted = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raw-http-handler", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> RawHttpServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def url(self, path: str, route: Route, port: int | None = None) -> str:
        self.routes[path] = route
        return f"http://127.0.0.1:{port or self.port}{path}"

    def hits(self, job_id: str) -> list[Hit]:
        with self._lock:
            return [h for h in self._hits if h.job_id == job_id]

    def endings(self, job_id: str) -> list[Ending]:
        with self._lock:
            return [e for e in self._endings if e.hit.job_id == job_id]

    def record_ending(self, hit: Hit, bytes_sent: int) -> None:
        with self._lock:
            self._endings.append(Ending(hit, time.monotonic(), bytes_sent))

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        with self._lock:
            self.accepted += 1
            number = self.accepted
        keep = True
        try:
            while keep:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed its idle keep-alive connection
                request_line, *lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines:
                    name, _, value = line.partition(":")
                    if name:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                hit = Hit(request_line.split()[1], headers, body, number)
                with self._lock:
                    self._hits.append(hit)
                route = self.routes.get(hit.path)
                if route is None:
                    writer.write(response(404, b"no such route"))
                    await writer.drain()
                    continue
                keep = await route(hit, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)


# -- routes ------------------------------------------------------------------------------------------------


async def ok(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(200, b"ok"))
    await writer.drain()
    return True


async def broken(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(500, f"database is down (attempt {hit.attempt})".encode()))
    await writer.drain()
    return True


async def reset_mid_body(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Attempt 1: a 200 promising 100 kB, 1 kB of it, then RST. Later attempts: 200."""
    if hit.attempt > 1:
        return await ok(hit, reader, writer)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
    await writer.drain()
    rst(writer)
    return False


async def until_closed(
    hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunk: bytes, every: float
) -> int:
    """Write `chunk` every `every` seconds until the client closes the connection; returns the bytes written."""
    eof = asyncio.ensure_future(reader.read(1))  # the client never sends more: this ends on its close
    sent = 0
    try:
        while not eof.done():
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
            if every:
                await asyncio.wait({eof}, timeout=every)
            else:
                await asyncio.sleep(0)
    except ConnectionError:
        pass
    finally:
        eof.cancel()
        await asyncio.gather(eof, return_exceptions=True)
    return sent


def drip(server: RawHttpServer) -> Route:
    """Attempt 1: a 200 whose 50-byte body comes one byte every 200 ms (10 s in all). Later attempts: 200."""

    async def route(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if hit.attempt > 1:
            return await ok(hit, reader, writer)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
        server.record_ending(hit, await until_closed(hit, reader, writer, b".", 0.2))
        return False

    return route


def endless(server: RawHttpServer) -> Route:
    """A 200 announcing 1 GiB, written as fast as the client takes it, until the client hangs up."""

    async def route(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {BIG_BODY}\r\n\r\n".encode())
        server.record_ending(hit, await until_closed(hit, reader, writer, PATTERN, 0))
        return False

    return route


def snooze(status: int) -> Route:
    """The first request of each job: `status` with Retry-After 7. Later requests: 200."""
    seen: set[str] = set()

    async def route(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if hit.job_id in seen:
            return await ok(hit, reader, writer)
        seen.add(hit.job_id)
        writer.write(response(status, b"come back later", {"Retry-After": str(RETRY_AFTER)}))
        await writer.drain()
        return True

    return route


async def reject(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(response(422, b"invalid order"))
    await writer.drain()
    return True


def held(server: RawHttpServer) -> Route:
    """Attempt 1 is never answered (the proxy in front resets it). Later attempts: 200."""

    async def route(hit: Hit, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if hit.attempt > 1:
            return await ok(hit, reader, writer)
        try:
            async with asyncio.timeout(30):
                await reader.read(1)
        finally:
            server.record_ending(hit, 0)
        return False

    return route


# -- the daemon's sockets, from /proc -------------------------------------------------------------------------

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT",
              "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}  # fmt: skip


def sockets_to(pid: int, port: int) -> list[str]:
    """The TCP states of the sockets that process `pid` holds open to 127.0.0.1:`port` (its fds, /proc/net/tcp)."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    states = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[9] in inodes and remote_port == port:
                    states.append(TCP_STATES.get(fields[3], fields[3]))
    return states


def retry_durations(daemon: DaemonProcess, job_id: str) -> list[float]:
    """The daemon's own measure of each retried attempt of a job, from its "job retried" log lines."""
    return [float(line["duration_s"]) for line in daemon.lines()
            if str(line.get("msg", "")).startswith("job retried:") and line.get("job_id") == job_id]  # fmt: skip


def errors_of(job: Job) -> list[tuple[int, str]]:
    return [(e.attempt, e.error) for e in job.errors]


def test_every_http_outcome_in_one_daemon_run(redis_server: RedisServer, namespace: str, tmp_path: Path) -> None:
    with RawHttpServer() as app, FaultProxy("127.0.0.1", app.port) as proxy:
        handlers = {
            "http.ok": {"url": app.url("/ok", ok)},
            "http.broken": {"url": app.url("/broken", broken), "max_attempts": 3, "backoff": FAIL_BACKOFF},
            "http.reset": {"url": app.url("/reset", reset_mid_body)},
            "http.drip": {"url": app.url("/drip", drip(app)), "timeout": f"{DRIP_TIMEOUT}s"},
            # max_attempts 1: a snooze that spent the attempt would send the job to the DLQ.
            "http.busy": {"url": app.url("/busy", snooze(429)), "max_attempts": 1},
            "http.unavailable": {"url": app.url("/unavailable", snooze(503)), "max_attempts": 1},
            "http.reject": {"url": app.url("/reject", reject)},
            "http.gone": {"url": f"http://127.0.0.1:{app.port}/no-such-route"},
            "http.big": {"url": app.url("/big", endless(app)), "max_response_bytes": "1KiB"},
            "http.proxied": {"url": app.url("/held", held(app), port=proxy.port)},
        }
        config = write_config(tmp_path, redis_server.url, namespace, handlers, concurrency=CONCURRENCY,
                              result_ttl="1h")  # fmt: skip
        daemon = DaemonProcess(config).start()
        try:
            with redis_server.client() as client:
                run_every_outcome(app, proxy, daemon, QueueDriver(client, namespace))
        finally:
            daemon.stop()


def run_every_outcome(app: RawHttpServer, proxy: FaultProxy, daemon: DaemonProcess, q: QueueDriver) -> None:
    started = time.monotonic()
    busy, unavailable = q.enqueue("http.busy", {"n": 1}).id, q.enqueue("http.unavailable", {"n": 2}).id
    proxied = q.enqueue("http.proxied", {"n": 3}).id
    drip_id, big = q.enqueue("http.drip", {"n": 4}).id, q.enqueue("http.big", {"n": 5}).id
    broken_ids = [q.enqueue("http.broken", {"n": n}).id for n in range(4)]
    reset_ids = [q.enqueue("http.reset", {"n": n}).id for n in range(2)]
    rejected, gone = q.enqueue("http.reject", {}).id, q.enqueue("http.gone", {}).id
    ok_ids = [i.id for i in q.producer.enqueue_many([("http.ok", {"n": n}) for n in range(30)])]

    # Through the proxy: attempt 1 waits for an answer that never comes; the proxy resets both sides.
    wait_for(lambda: app.hits(proxied), what="the proxied request to reach the handler")
    assert proxy.reset() >= 1
    job = wait_state(q, proxied, State.DONE, daemon)
    assert job.attempt == 2
    assert job.errors[0].attempt == 1
    assert job.errors[0].error.startswith("connection reset"), errors_of(job)
    assert [h.attempt for h in app.hits(proxied)] == [1, 2]

    # 2xx: done, the handler's body kept as the result.
    for job_id in ok_ids:
        job = wait_state(q, job_id, State.DONE, daemon)
        assert (job.attempt, job.result, job.errors) == (1, b"ok", ())

    # 5xx: retried with a jittered, capped backoff, then dead with every attempt's error.
    gaps = []
    for job_id in broken_ids:
        job = wait_state(q, job_id, State.DEAD, daemon)
        assert job.attempt == 3, errors_of(job)
        assert [e.attempt for e in job.errors] == [1, 2, 3], errors_of(job)
        for attempt, error in errors_of(job):
            assert error.startswith(f"HTTP 500 Internal Server Error: database is down (attempt {attempt})"), error
        assert job.errors[-1].error.endswith("(attempts exhausted: 3 of 3)")
        hits = app.hits(job_id)
        assert [h.attempt for h in hits] == [1, 2, 3]
        gaps += [hits[1].at - hits[0].at, hits[2].at - hits[1].at]
    # Full jitter: the wait after attempt n is uniform in [0, min(max, base * 2^(n-1))] = [0, 0.4] then [0, 0.8].
    for n, gap in enumerate(gaps):
        assert 0 <= gap <= (0.4 if n % 2 == 0 else 0.8) + DEADLINE_MARGIN, gaps
    assert max(gaps) - min(gaps) > 0.05, f"retries after a 5xx are jittered, not in lockstep: {gaps}"

    # Reset mid-body: retried, then done.
    for job_id in reset_ids:
        job = wait_state(q, job_id, State.DONE, daemon)
        assert job.attempt == 2, errors_of(job)
        assert job.errors[0].error.startswith("connection reset"), errors_of(job)

    # A body dripping one byte per 200 ms for 10 s: the total deadline ends the attempt, not the idle gaps.
    job = wait_state(q, drip_id, State.DONE, daemon)
    assert job.attempt == 2, errors_of(job)
    assert errors_of(job)[0] == (1, f"timeout after {DRIP_TIMEOUT:.1f}s"), errors_of(job)
    wait_for(lambda: app.endings(drip_id), what="the dripping connection to be closed by the daemon")
    [ending] = app.endings(drip_id)
    assert DRIP_TIMEOUT - 0.25 <= ending.duration <= DRIP_TIMEOUT + DEADLINE_MARGIN, ending
    assert ending.bytes_sent < 50, "the deadline, not the end of the body, ended the attempt"
    [daemon_measure] = retry_durations(daemon, drip_id)
    assert DRIP_TIMEOUT - 0.01 <= daemon_measure <= DRIP_TIMEOUT + DEADLINE_MARGIN, daemon_measure

    # Other 4xx: straight to the dead-letter queue after one attempt.
    for job_id, reason in ((rejected, "HTTP 422 Unprocessable Entity: invalid order"), (gone, "HTTP 404 Not Found")):
        job = wait_state(q, job_id, State.DEAD, daemon)
        assert job.attempt == 1
        assert len(app.hits(job_id)) == 1
        assert (job.last_error or "").startswith(reason), errors_of(job)

    # A 2xx with a 1 GiB body: RESPONSE_CAP bytes kept, and the connection dropped rather than drained.
    job = wait_state(q, big, State.DONE, daemon)
    assert job.result == PATTERN[:RESPONSE_CAP]
    wait_for(lambda: app.endings(big), what="the daemon to hang up on the endless body")
    [big_ending] = app.endings(big)
    # What the server got out before the hang-up is what the socket buffers took (a few MiB on loopback).
    assert big_ending.bytes_sent < 64 * 1024 * 1024, big_ending.bytes_sent

    # 429 and 503 with Retry-After: 7: the next attempt 7 s later or more, and it is still attempt 1.
    for job_id, status in ((busy, 429), (unavailable, 503)):
        job = wait_state(q, job_id, State.DONE, daemon, timeout=RETRY_AFTER + 15)
        first, second = app.hits(job_id)
        assert second.at - first.at >= RETRY_AFTER, (status, second.at - first.at)
        assert (first.attempt, second.attempt, job.attempt) == (1, 1, 1), "the snooze spent no attempt"
        assert f"HTTP {status}" in job.errors[0].error
        assert f"Retry-After: {RETRY_AFTER}" in job.errors[0].error

    # No leaked sockets: the pool holds at most one connection per job that can run at once, all healthy, and
    # it does not grow with more jobs (nor with more broken connections).
    first_wave = settled_sockets(daemon, app.port)
    more = [i.id for i in q.producer.enqueue_many([("http.ok", {"n": n}) for n in range(60)])]
    more += [q.enqueue("http.reset", {"n": n}).id for n in range(4)]
    for job_id in more:
        wait_state(q, job_id, State.DONE, daemon)
    second_wave = settled_sockets(daemon, app.port)
    assert sockets_to(daemon.pid, proxy.port) in ([], ["ESTABLISHED"])
    assert daemon.process is not None
    assert daemon.process.poll() is None, "the daemon is still running"
    assert not [line for line in daemon.lines() if line.get("level") in ("error", "critical")], daemon.log_tail()
    print(
        f"\ndrip attempt: {ending.duration * 1000:.0f} ms at the handler, {daemon_measure * 1000:.0f} ms in the daemon "
        f"(timeout {DRIP_TIMEOUT * 1000:.0f} ms); endless body: {big_ending.bytes_sent} bytes sent before the hang-up; "
        f"5xx backoff gaps {sorted(round(g, 3) for g in gaps)}; sockets to the handler after {len(ok_ids) + 15} jobs: "
        f"{len(first_wave)}, after {len(ok_ids) + 15 + len(more)}: {len(second_wave)} (concurrency {CONCURRENCY}); "
        f"{app.accepted} connections accepted in all; {time.monotonic() - started:.1f} s"
    )


def settled_sockets(daemon: DaemonProcess, port: int) -> list[str]:
    """The daemon's sockets to the handler once bounded by the pool size; all must be healthy keep-alives."""
    wait_for(lambda: len(sockets_to(daemon.pid, port)) <= CONCURRENCY, timeout=5,
             what=f"at most {CONCURRENCY} sockets to the handler: {sockets_to(daemon.pid, port)}")  # fmt: skip
    states = sockets_to(daemon.pid, port)
    assert set(states) <= {"ESTABLISHED"}, f"half-closed or dying sockets left behind: {states}"
    return states
