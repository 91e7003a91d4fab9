"""The HTTP executor: POST the payload to the handler's URL and map the answer to an Outcome.

The status mapping (DESIGN §3, docs/protocol.md):

- 2xx: success; the first `max_response_bytes` of the body become the result.
- 429 or 503 with a valid `Retry-After`: try again then, without spending an attempt (capped at
  `max_retry_after`, so a handler cannot park a job forever).
- 408, 425, 429, 5xx, connection errors, resets and timeouts: retry, spending the attempt.
- 3xx and any other 4xx: permanent failure (the handler rejected the job; redirects are not followed,
  since re-POSTing a job body to wherever a redirect points is not something to do silently).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import hmac
import re
import time
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Final

import aiohttp
from multidict import CIMultiDict

from jobcar.config_types import HttpHandler
from jobcar.executors import rfc3339
from jobcar.job import Job
from jobcar.outcome import Outcome

__all__ = ["HttpExecutor", "sign", "verify_signature"]

#: How much of an error response's body goes into last_error.
ERROR_BODY_BYTES: Final = 500
_CHUNK: Final = 64 * 1024
#: Statuses that mean "not now" rather than "never".
_RETRYABLE: Final = frozenset({408, 425, 429})
#: Statuses whose Retry-After asks for a later slot without spending an attempt.
_SNOOZABLE: Final = frozenset({429, 503})
_DELTA_SECONDS: Final = re.compile(r"[0-9]+")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `Jobcar-Signature` value for a body sent at `timestamp` (unix seconds): `v1=<hex>`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_signature(
    secret: str,
    timestamp: str | int,
    body: bytes,
    signature: str,
    tolerance_s: float = 300,
    *,
    now: float | None = None,
) -> bool:
    """Check a request's `Jobcar-Timestamp` and `Jobcar-Signature` headers against the raw body.

    For handler authors: verify before parsing the body. The timestamp must be within `tolerance_s` of
    `now` (default: the current time), which bounds replays of a captured request. `signature` may
    hold several comma-separated `v1=` values (during a secret rotation); one match is enough. The
    comparison runs in constant time.
    """
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance_s:
        return False
    expected = sign(secret, sent_at, body)
    candidates = [part.strip() for part in signature.split(",")]
    return any(hmac.compare_digest(expected.encode(), cand.encode()) for cand in candidates if cand)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or HTTP-date), None when invalid."""
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 9110 HTTP-dates are always GMT; parsedate_to_datetime leaves "-0000" naive.
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


class HttpExecutor:
    """Runs jobs of one HTTP handler over a shared `aiohttp.ClientSession`.

    The session (and its keep-alive pool) belongs to the caller: `close()` leaves it open.
    """

    def __init__(self, handler: HttpHandler, session: aiohttp.ClientSession) -> None:
        self.handler = handler
        self._session = session

    def _headers(self, job: Job, body: bytes, *, deadline: float, max_attempts: int) -> CIMultiDict[str]:
        # The handler's configured headers go first so that they can never overwrite the job's own
        # metadata or its signature; header names are case-insensitive, so the merge is too.
        headers: CIMultiDict[str] = CIMultiDict(self.handler.headers)
        headers.update(
            {
                "Content-Type": job.content_type,
                "Jobcar-Job-Id": job.id,
                "Jobcar-Job-Type": job.type,
                "Jobcar-Queue": job.queue,
                "Jobcar-Attempt": str(job.attempt),
                "Jobcar-Max-Attempts": str(max_attempts),
                "Jobcar-Enqueued-At": rfc3339(job.created_ms / 1000),
                "Jobcar-Deadline": rfc3339(deadline),
            }
        )
        if job.traceparent:
            headers["traceparent"] = job.traceparent
        if self.handler.signing_secret:
            timestamp = int(time.time())
            headers["Jobcar-Timestamp"] = str(timestamp)
            headers["Jobcar-Signature"] = sign(self.handler.signing_secret, timestamp, body)
        return headers

    async def run(self, job: Job, *, deadline: float, max_attempts: int) -> Outcome:
        budget = min(self.handler.timeout, deadline - time.time())
        if budget <= 0:
            return Outcome.retry("timeout: the job's deadline passed before the request was sent")
        headers = self._headers(job, job.payload, deadline=deadline, max_attempts=max_attempts)
        # Both clocks on purpose: aiohttp's total timeout replaces the session's default (which may
        # be shorter than a long handler timeout), asyncio.timeout also covers our own body reads.
        # CancelledError is never caught here: it propagates through aiohttp, which closes the
        # connection, so the handler sees the client go away.
        try:
            async with asyncio.timeout(budget):
                return await self._post(job.payload, headers, budget)
        except TimeoutError:
            return Outcome.retry(f"timeout after {budget:.1f}s")
        except aiohttp.InvalidURL as exc:
            return Outcome.fail(f"invalid handler URL: {exc}")
        except (aiohttp.ClientError, OSError) as exc:
            return Outcome.retry(_describe(exc))

    async def _post(self, body: bytes, headers: CIMultiDict[str], budget: float) -> Outcome:
        async with self._session.post(
            self.handler.url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=budget),
        ) as response:
            status = response.status
            if 200 <= status < 300:
                # A reset before the cap is reached raises (and retries); a body beyond the cap is
                # cut and the connection dropped instead of reused.
                return Outcome.success(await _read_capped(response, self.handler.max_response_bytes))
            return await self._error_outcome(response)

    async def _error_outcome(self, response: aiohttp.ClientResponse) -> Outcome:
        status = response.status
        try:
            head = await _read_capped(response, ERROR_BODY_BYTES)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            # The status already decided the outcome; a body cut short only shortens the message.
            head = b""
        text = head.decode("utf-8", errors="replace").strip()
        reason = f"HTTP {status} {response.reason or ''}".rstrip()
        if status in _SNOOZABLE:
            header = response.headers.get("Retry-After")
            after = parse_retry_after(header)
            if after is not None:
                after = min(after, self.handler.max_retry_after)
                return Outcome.retry(
                    _message(f"{reason} (Retry-After: {header})", text), after=after, spend_attempt=False
                )
        if status in _RETRYABLE or status >= 500:
            return Outcome.retry(_message(reason, text))
        return Outcome.fail(_message(reason, text))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection failed: {exc}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"connection reset: {exc.message or 'server disconnected'}"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return f"connection reset: {exc}"
    if isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return f"connection reset: {exc}"
    return f"request failed: {type(exc).__name__}: {exc}"


def _message(reason: str, body_text: str) -> str:
    return f"{reason}: {body_text}" if body_text else reason


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of the body, read in chunks: an endless body never lands in memory."""
    parts: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = await response.content.read(min(_CHUNK, remaining))
        if not chunk:
            break
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)
