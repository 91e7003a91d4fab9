"""The HTTP executor: POST the payload to the handler's URL and map the answer to an Outcome.

The status mapping (docs/delivery-semantics.md):

- 2xx: success; the first `max_response_bytes` of the body become the result.
- 429 or 503 with a valid `Retry-After`: try again then, without spending an attempt (capped at
  `max_retry_after`, so a handler cannot park a job forever).
- 408, 425, 429, 5xx, connection errors, resets and timeouts: retry, spending the attempt.
- 3xx and any other 4xx: permanent failure (the handler rejected the job; redirects are not followed,
  since re-POSTing a job body to wherever a redirect points is not something to do silently).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Final

from jobcar import __version__
from jobcar.attempt_desk import TOKEN_HEADER, URL_HEADER, LiveAttempt
from jobcar.config_types import HttpHandler
from jobcar.executors.batch_wire import http_body, outcomes_from_array
from jobcar.executors.http_client import (
    ConnectFailed,
    ConnectionClosed,
    HttpClient,
    RequestFailed,
    Response,
    parse_url,
)
from jobcar.job import Job
from jobcar.outcome import Outcome
from jobcar.timestamps import rfc3339, rfc3339_ms

__all__ = ["HttpExecutor", "sign", "verify_signature"]

#: How much of an error response's body goes into last_error.
ERROR_BODY_BYTES: Final = 500
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


#: Headers the daemon sets on every request; a handler's configured headers of these names are dropped.
_OWN_HEADERS: Final = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "jobcar-job-id",
        "jobcar-job-type",
        "jobcar-queue",
        "jobcar-attempt",
        "jobcar-max-attempts",
        "jobcar-enqueued-at",
        "jobcar-deadline",
        "jobcar-timestamp",
        "jobcar-signature",
        "jobcar-batch-size",
        URL_HEADER.lower(),
        TOKEN_HEADER.lower(),
    }
)
#: Job fields end up in header values: a line break there would let a producer forge headers.
_UNSAFE_IN_HEADER: Final = re.compile(r"[\r\n\0]")


class HttpExecutor:
    """Runs jobs of one HTTP handler over a shared `HttpClient` (its keep-alive pool).

    The client belongs to the caller: nothing here closes it.
    """

    def __init__(self, handler: HttpHandler, client: HttpClient) -> None:
        self.handler = handler
        self._client = client
        target = parse_url(handler.url)
        self._origin = target.origin
        # Everything that is the same for every job of this handler, built once: the request line, then
        # our defaults (Host, User-Agent, credentials from the URL), which configured headers replace,
        # then the other configured headers. The job's own metadata follows per request and is never
        # overwritten: configured headers of those names are dropped. Names compare case-insensitively.
        defaults = {"host": ("Host", target.host_header), "user-agent": ("User-Agent", f"jobcar/{__version__}")}
        if target.authorization:
            defaults["authorization"] = ("Authorization", target.authorization)
        configured = {name.lower(): (name, value) for name, value in handler.headers.items()}
        traceparent = configured.pop("traceparent", None)
        headers = {**defaults, **configured}
        lines = [f"POST {target.path} HTTP/1.1"]
        lines += [f"{name}: {value}" for key, (name, value) in headers.items() if key not in _OWN_HEADERS]
        self._head = "\r\n".join(lines) + "\r\n"
        # A configured traceparent is sent only for jobs that bring none of their own.
        self._default_traceparent = f"traceparent: {traceparent[1]}\r\n" if traceparent else ""
        self._limit = max(handler.max_response_bytes, ERROR_BODY_BYTES)

    def _request_head(
        self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None
    ) -> bytes | None:
        """The request head for one job, or None when a job field would break out of its header."""
        after = job.after_header
        job_fields = job.content_type + job.id + job.type + job.queue + (job.traceparent or "") + (job.schedule or "")
        job_fields += after or ""
        if _UNSAFE_IN_HEADER.search(job_fields):
            return None
        traceparent = attempt.traceparent if attempt is not None and attempt.traceparent else job.traceparent
        trace_line = f"traceparent: {traceparent}\r\n" if traceparent else self._default_traceparent
        # Where the handler calls back during the attempt (its URL quotes the job id).
        callback = f"{URL_HEADER}: {attempt.url}\r\n{TOKEN_HEADER}: {attempt.token}\r\n" if attempt is not None else ""
        # The usual job's head is this one string: every job pays for each piece added to it.
        head = (
            f"{self._head}Content-Type: {job.content_type}\r\nContent-Length: {len(job.payload)}\r\n"
            f"Jobcar-Job-Id: {job.id}\r\nJobcar-Job-Type: {job.type}\r\nJobcar-Queue: {job.queue}\r\n"
            f"Jobcar-Attempt: {job.attempt}\r\nJobcar-Max-Attempts: {max_attempts}\r\n"
            f"Jobcar-Enqueued-At: {rfc3339(job.created_ms / 1000)}\r\nJobcar-Deadline: {rfc3339(deadline)}\r\n"
            f"{trace_line}{callback}"
        )
        if job.scheduled_at_ms is not None:  # a periodic job: which schedule, and which of its ticks
            head += f"Jobcar-Schedule: {job.schedule}\r\nJobcar-Scheduled-At: {rfc3339_ms(job.scheduled_at_ms)}\r\n"
        if after:  # a step of a chain: which jobs it ran after (their results, while kept, are theirs)
            head += f"Jobcar-After: {after}\r\n"
        if self.handler.signing_secret:
            head += self._signature(job.payload)
        return (head + "\r\n").encode()

    def _signature(self, body: bytes) -> str:
        if not self.handler.signing_secret:
            return ""
        timestamp = int(time.time())
        signature = sign(self.handler.signing_secret, timestamp, body)
        return f"Jobcar-Timestamp: {timestamp}\r\nJobcar-Signature: {signature}\r\n"

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        started = time.time()
        budget = min(self.handler.timeout, deadline - started)
        if budget <= 0:
            return Outcome.retry("timeout: the job's deadline passed before the request was sent")
        head = self._request_head(job, deadline=deadline, max_attempts=max_attempts, attempt=attempt)
        if head is None:
            return Outcome.fail("the job's id, type, queue, content type, traceparent or schedule holds a line break")
        # CancelledError is never caught here: the client drops the connection, so the handler sees
        # the client go away.
        try:
            if attempt is not None and attempt.extendable:
                # Its deadline may move (the handler asks for more time): the attempt's own timeout ends it, and
                # the client's is only the latest it could reach. Not on every request: it costs (ADR 0006).
                attempt.deadline = started + budget
                expires = asyncio.get_running_loop().time() + attempt.latest - started
                async with attempt.bounded():
                    response = await self._client.post(self._origin, head, job.payload, self._limit, expires)
            else:
                expires = asyncio.get_running_loop().time() + budget
                response = await self._client.post(self._origin, head, job.payload, self._limit, expires)
        except TimeoutError:
            if attempt is not None and attempt.deadline > started + budget:
                return Outcome.retry(f"timeout after {attempt.deadline - started:.1f}s (extended by its handler)")
            return Outcome.retry(f"timeout after {budget:.1f}s")
        except RequestFailed as exc:
            return Outcome.retry(_describe(exc))
        if 200 <= response.status < 300:
            # A body beyond the cap was cut (and its connection dropped instead of reused).
            return Outcome.success(response.body[: self.handler.max_response_bytes])
        return self._error_outcome(response)

    async def run_batch(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float,
        max_attempts: Sequence[int],
        attempts: Sequence[LiveAttempt] = (),
    ) -> list[Outcome]:
        """POST the jobs as one JSON array; each gets its own outcome from the answer (`batch_wire`). An
        answer that is not a 2xx, a timeout or a failed request is every job's outcome."""
        count = len(jobs)
        budget = min(self.handler.timeout, deadline - time.time())
        if budget <= 0:
            return [Outcome.retry("timeout: the batch's deadline passed before the request was sent")] * count
        first = jobs[0]  # a batch holds jobs of one type and one queue
        if _UNSAFE_IN_HEADER.search(first.type + first.queue):
            return [Outcome.fail("the job's type or queue holds a line break")] * count
        body = http_body(jobs, max_attempts, attempts)
        limit = self._limit * count  # the answer holds a result of up to max_response_bytes per job
        head = (
            f"{self._head}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Jobcar-Job-Type: {first.type}\r\nJobcar-Queue: {first.queue}\r\nJobcar-Batch-Size: {count}\r\n"
            f"Jobcar-Deadline: {rfc3339(deadline)}\r\n{self._default_traceparent}{self._signature(body)}\r\n"
        )
        try:
            expires = asyncio.get_running_loop().time() + budget
            response = await self._client.post(self._origin, head.encode(), body, limit, expires)
        except TimeoutError:
            return [Outcome.retry(f"timeout after {budget:.1f}s (the whole batch of {count})")] * count
        except RequestFailed as exc:
            return [Outcome.retry(_describe(exc))] * count
        if not 200 <= response.status < 300:
            return [self._error_outcome(response)] * count
        if response.truncated:
            why = f"batch answer: the response is longer than {limit} bytes (max_response_bytes per job)"
            return [Outcome.retry(why)] * count
        handler = self.handler
        return outcomes_from_array(jobs, response.body, result_limit=handler.max_response_bytes,
                                   max_retry_after=handler.max_retry_after)  # fmt: skip

    def _error_outcome(self, response: Response) -> Outcome:
        status = response.status
        text = response.body[:ERROR_BODY_BYTES].decode("utf-8", errors="replace").strip()
        reason = f"HTTP {status} {response.reason}".rstrip()
        if status in _SNOOZABLE:
            header = response.header("Retry-After")
            after = parse_retry_after(header)
            if after is not None:
                after = min(after, self.handler.max_retry_after)
                return Outcome.retry(
                    _message(f"{reason} (Retry-After: {header})", text), after=after, spend_attempt=False,
                    busy=status == 429,
                )  # fmt: skip
        if status in _RETRYABLE or status >= 500:
            return Outcome.retry(_message(reason, text))
        return Outcome.fail(_message(reason, text))


def _describe(exc: RequestFailed) -> str:
    if isinstance(exc, ConnectFailed):
        return f"connection failed: {exc}"
    if isinstance(exc, ConnectionClosed):
        return f"connection reset: {exc}"
    return f"request failed: {exc}"


def _message(reason: str, body_text: str) -> str:
    return f"{reason}: {body_text}" if body_text else reason
