"""The HTTP executor against real aiohttp servers on 127.0.0.1 (guarantee 11 of docs/delivery-semantics.md):
statuses, headers, Retry-After, timeouts, capped bodies, resets mid-body, signing and cancellation."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import formatdate
from typing import Any

import pytest
from aiohttp import web

from jobcar.config_types import Backoff, HttpHandler
from jobcar.executors.http import HttpExecutor, parse_retry_after, verify_signature
from jobcar.executors.http_client import HttpClient
from jobcar.job import Job
from jobcar.outcome import Outcome, OutcomeKind
from tests import factories
from tests.servers import free_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BINARY_PAYLOAD = b'\x00\xff\xfe{"user": 42}\x00\x80\xc3\x28 ; $(id) `id`\r\n\x00'


def make_handler(url: str, **overrides: Any) -> HttpHandler:
    fields: dict[str, Any] = {
        "type": "email.welcome",
        "timeout": 10.0,
        "max_attempts": 5,
        "backoff": Backoff(),
        "max_retry_after": 3600.0,
        "url": url,
    }
    fields.update(overrides)
    return HttpHandler(**fields)


def make_job(payload: bytes = b'{"user": 42}', **overrides: Any) -> Job:
    return factories.make_job(payload, **{"queue": "critical", "type": "email.welcome", "attempt": 2, **overrides})


@dataclass
class Seen:
    """What the test server received, for assertions."""

    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def http_client() -> AsyncIterator[HttpClient]:
    client = HttpClient()
    try:
        yield client
    finally:
        await client.close()


def recording(received: list[web.Request]) -> Handler:
    """A handler that keeps every request it gets (headers stay readable) and answers 204."""

    async def handler(request: web.Request) -> web.Response:
        received.append(request)
        return web.Response(status=204)

    return handler


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """A real aiohttp server on a free loopback port answering every POST with `handler`."""
    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    # handler_cancellation: a request handler learns (via CancelledError) that the client went away.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/jobs/email-welcome"
    finally:
        await runner.cleanup()


async def post_once(url: str, job: Job | None = None, *, deadline_in: float = 30.0, **overrides: Any) -> Outcome:
    async with http_client() as client:
        executor = HttpExecutor(make_handler(url, **overrides), client)
        return await executor.run(job or make_job(), deadline=time.time() + deadline_in, max_attempts=5)


async def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Outcome:
    """Run one job against a server that always answers `status` with `body` and `headers`."""

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, body=body, headers=headers)

    async with serve(handler) as url:
        return await post_once(url)


async def test_2xx_is_success_with_the_body_as_result() -> None:
    outcome = await answer(200, b'{"sent": true}')
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    assert outcome.result == b'{"sent": true}'
    assert (await answer(204)).kind is OutcomeKind.SUCCESS


async def test_request_carries_the_exact_body_and_the_job_metadata_headers() -> None:
    seen = Seen()

    async def handler(request: web.Request) -> web.Response:
        seen.requests.append((dict(request.headers), await request.read()))
        return web.Response(text="ok")

    deadline = time.time() + 30

    async with serve(handler) as url, http_client() as client:
        handler_config = make_handler(url, headers={"Authorization": "Bearer t0k", "Jobcar-Job-Id": "spoofed"})
        job = make_job(BINARY_PAYLOAD, content_type="application/octet-stream", traceparent=TRACEPARENT)
        outcome = await HttpExecutor(handler_config, client).run(job, deadline=deadline, max_attempts=7)
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    [(headers, body)] = seen.requests
    assert body == BINARY_PAYLOAD, "the payload must arrive byte for byte"
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Jobcar-Job-Id"] == "job-1", "configured headers must not override the job's metadata"
    assert headers["Jobcar-Job-Type"] == "email.welcome"
    assert headers["Jobcar-Queue"] == "critical"
    assert headers["Jobcar-Attempt"] == "2"
    assert headers["Jobcar-Max-Attempts"] == "7"
    assert headers["Jobcar-Enqueued-At"] == "2023-11-14T22:13:20.123Z"
    assert headers["traceparent"] == TRACEPARENT
    assert headers["Authorization"] == "Bearer t0k"
    sent_deadline = headers["Jobcar-Deadline"]
    assert sent_deadline.endswith("Z")
    assert len(sent_deadline) == len("2023-11-14T22:13:20.123Z")
    assert abs(datetime.fromisoformat(sent_deadline).timestamp() - deadline) < 0.001
    assert "Jobcar-Signature" not in headers, "requests are only signed when a secret is configured"


async def test_5xx_is_a_retry_with_status_and_body_in_the_error() -> None:
    outcome = await answer(500, b"database is down\n" + b"x" * 2000)
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt
    assert outcome.retry_after is None
    assert outcome.error is not None
    assert outcome.error.startswith("HTTP 500 Internal Server Error: database is down")
    assert len(outcome.error) < 600, "only the start of the body belongs in the error"


async def test_429_with_retry_after_seconds_snoozes_without_spending_an_attempt() -> None:
    outcome = await answer(429, b"slow down", {"Retry-After": "7"})
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.retry_after == 7
    assert outcome.spend_attempt is False
    assert outcome.error is not None
    assert "429" in outcome.error
    assert "slow down" in outcome.error


async def test_503_with_an_http_date_retry_after() -> None:
    outcome = await answer(503, b"maintenance", {"Retry-After": formatdate(time.time() + 30, usegmt=True)})
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt is False
    assert outcome.retry_after is not None
    assert 25 <= outcome.retry_after <= 30


async def test_retry_after_is_capped_by_max_retry_after() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=503, headers={"Retry-After": "999999"})

    async with serve(handler) as url:
        outcome = await post_once(url, max_retry_after=60.0)
    assert outcome.retry_after == 60.0
    assert outcome.spend_attempt is False


async def test_429_or_503_without_a_valid_retry_after_spends_the_attempt() -> None:
    for outcome in (await answer(429), await answer(503, headers={"Retry-After": "soon"})):
        assert outcome.kind is OutcomeKind.RETRY
        assert outcome.spend_attempt is True
        assert outcome.retry_after is None


async def test_408_and_425_are_retried() -> None:
    for status in (408, 425):
        outcome = await answer(status)
        assert outcome.kind is OutcomeKind.RETRY, (status, outcome)
        assert outcome.spend_attempt, (status, outcome)


async def test_other_4xx_fail_permanently() -> None:
    for status in (400, 404, 422):
        outcome = await answer(status, b'{"error": "no such user"}')
        assert outcome.kind is OutcomeKind.FAIL, (status, outcome)
        assert outcome.error is not None
        assert str(status) in outcome.error
        assert "no such user" in outcome.error


async def test_a_redirect_is_not_followed_and_fails() -> None:
    outcome = await answer(302, headers={"Location": "http://127.0.0.1:1/elsewhere"})
    assert outcome.kind is OutcomeKind.FAIL
    assert outcome.error is not None
    assert outcome.error.startswith("HTTP 302")


async def test_a_slow_handler_times_out_and_is_retried() -> None:
    seen = Seen()

    async def handler(request: web.Request) -> web.Response:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.disconnected.set()
            raise
        return web.Response()

    async with serve(handler) as url:
        started = time.monotonic()
        outcome = await post_once(url, timeout=0.3)
        elapsed = time.monotonic() - started
        async with asyncio.timeout(5):
            await seen.disconnected.wait()
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt
    assert outcome.error == "timeout after 0.3s"
    assert elapsed < 2


async def test_the_jobs_deadline_bounds_the_request_when_it_is_sooner() -> None:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response()

    async with serve(handler) as url:
        outcome = await post_once(url, deadline_in=0.3, timeout=60.0)
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error is not None
    assert "timeout" in outcome.error
    past = await post_once("http://127.0.0.1:1/", deadline_in=-1)
    assert past.kind is OutcomeKind.RETRY
    assert past.error is not None
    assert "deadline" in past.error


async def test_a_large_response_body_is_cut_at_max_response_bytes() -> None:
    big = b"a" * (10 * 1024 * 1024)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=big)

    async with serve(handler) as url:
        outcome = await post_once(url, max_response_bytes=1000)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result == b"a" * 1000


async def test_an_endless_streamed_body_is_cut_too() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while True:
                await response.write(b"z" * 65536)
        return response

    async with serve(handler) as url:
        outcome = await post_once(url, max_response_bytes=100_000)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result == b"z" * 100_000


@contextlib.asynccontextmanager
async def raw_server(respond: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> AsyncIterator[str]:
    """A bare TCP server that reads one request and lets `respond` write whatever bytes it likes."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        await respond(writer)

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_reset_mid_body_is_retried() -> None:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        writer.transport.abort()

    async with raw_server(respond) as url:
        outcome = await post_once(url)
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt
    assert outcome.error is not None
    assert outcome.error.startswith("connection reset"), outcome.error


async def test_a_connection_closed_before_any_answer_is_retried() -> None:
    async def respond(writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with raw_server(respond) as url:
        outcome = await post_once(url)
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error is not None
    assert outcome.error.startswith("connection reset"), outcome.error


async def test_a_refused_connection_is_retried() -> None:
    outcome = await post_once(f"http://127.0.0.1:{free_port()}/")
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error is not None
    assert outcome.error.startswith("connection failed"), outcome.error


async def test_signed_requests_verify_with_verify_signature() -> None:
    seen = Seen()

    async def handler(request: web.Request) -> web.Response:
        seen.requests.append((dict(request.headers), await request.read()))
        return web.Response()

    async with serve(handler) as url:
        outcome = await post_once(url, make_job(BINARY_PAYLOAD), signing_secret="s3cret")
    assert outcome.kind is OutcomeKind.SUCCESS
    [(headers, body)] = seen.requests
    timestamp, signature = headers["Jobcar-Timestamp"], headers["Jobcar-Signature"]
    assert signature.startswith("v1=")
    assert abs(int(timestamp) - time.time()) < 60
    assert verify_signature("s3cret", timestamp, body, signature)
    assert verify_signature("s3cret", timestamp, body, f"v1=00ff, {signature}"), "any of several signatures"
    assert not verify_signature("other secret", timestamp, body, signature)
    assert not verify_signature("s3cret", timestamp, body + b"!", signature)
    assert not verify_signature("s3cret", int(timestamp) + 1, body, signature)
    assert not verify_signature("s3cret", timestamp, body, signature, now=int(timestamp) + 301), "a replay"
    assert not verify_signature("s3cret", "not-a-number", body, signature)


async def test_cancelling_the_run_aborts_the_request() -> None:
    seen = Seen()

    async def handler(request: web.Request) -> web.Response:
        seen.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.disconnected.set()
            raise
        return web.Response()

    async with serve(handler) as url, http_client() as client:
        executor = HttpExecutor(make_handler(url), client)
        task = asyncio.create_task(executor.run(make_job(), deadline=time.time() + 30, max_attempts=5))
        async with asyncio.timeout(5):
            await seen.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):
            await seen.disconnected.wait()


async def test_keep_alive_connections_are_reused_across_jobs() -> None:
    peers: set[object] = set()

    async def handler(request: web.Request) -> web.Response:
        peers.add(request.transport and request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    async with serve(handler) as url, http_client() as client:
        executor = HttpExecutor(make_handler(url), client)
        outcomes = [await executor.run(make_job(), deadline=time.time() + 30, max_attempts=5) for _ in range(5)]
    assert all(o.kind is OutcomeKind.SUCCESS for o in outcomes)
    assert len(peers) == 1, "one shared client: jobs reuse one keep-alive connection"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("7", 7.0), (" 120 ", 120.0), ("0", 0.0), ("-5", None), ("1.5", None), ("soon", None), ("", None), (None, None)],
)
def test_parse_retry_after_delta_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_parse_retry_after_http_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:50 GMT", now=now) == 30.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0, "a date in the past means now"


async def test_configured_headers_never_duplicate_jobcar_metadata_whatever_their_case() -> None:
    received: list[web.Request] = []
    handler = recording(received)

    async with serve(handler) as url:
        headers = {"content-type": "text/evil", "jobcar-attempt": "99", "CONTENT-LENGTH": "1", "X-Tenant": "acme"}
        outcome = await post_once(url, make_job(b"{}", attempt=2), headers=headers)
    assert outcome.kind is OutcomeKind.SUCCESS
    [request] = received
    assert request.headers.getall("Content-Type") == ["application/json"]
    assert request.headers.getall("Jobcar-Attempt") == ["2"]
    assert request.headers.getall("Content-Length") == ["2"]
    assert request.headers["x-tenant"] == "acme"


async def test_configured_host_user_agent_and_authorization_replace_the_defaults() -> None:
    received: list[web.Request] = []
    handler = recording(received)

    async with serve(handler) as url:
        with_credentials = url.replace("http://", "http://svc:s%40cret@")
        outcomes = [
            await post_once(with_credentials),
            await post_once(url, headers={"host": "app.internal", "User-Agent": "billing-jobs/2"}),
            await post_once(with_credentials, headers={"AUTHORIZATION": "Bearer t0k"}),
        ]
    assert all(o.kind is OutcomeKind.SUCCESS for o in outcomes)
    defaults, configured, bearer = (r.headers for r in received)
    assert defaults.getall("Authorization") == ["Basic " + base64.b64encode(b"svc:s@cret").decode()]
    assert defaults["User-Agent"].startswith("jobcar/")
    assert defaults["Host"].startswith("127.0.0.1:")
    assert configured.getall("Host") == ["app.internal"]
    assert configured.getall("User-Agent") == ["billing-jobs/2"]
    assert bearer.getall("Authorization") == ["Bearer t0k"]


async def test_a_line_break_in_a_job_field_fails_the_job_instead_of_forging_headers() -> None:
    received: list[web.Request] = []
    handler = recording(received)

    async with serve(handler) as url:
        outcomes = [
            await post_once(url, make_job(content_type="text/plain\r\nX-Forged: 1")),
            await post_once(url, make_job(traceparent="00-abc\nX-Forged: 1")),
        ]
    for outcome in outcomes:
        assert outcome.kind is OutcomeKind.FAIL, outcome
        assert "line break" in (outcome.error or ""), outcome
    assert received == [], "nothing was sent"
