"""The attempts a handler may call back: each running attempt's secret token, its deadline (which the
handler may move, within its handler's `max_extend`), and whether the handler already answered through
the handler API. The attempts (attempts.py) open and close them; the handler API (handler_api.py) finds
them here. Nothing here is stored in Redis: a handler calls the daemon that runs its attempt.

A token is 192 random bits, made per attempt, compared in constant time, and never logged or stored: it
is good for one job's one attempt, and only while that attempt runs here. A closed attempt keeps its
reason for a while (`_ENDED_KEPT` of them), so a late call hears why it is refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol
from urllib.parse import quote

from jobcar.config_types import Config
from jobcar.job import Job
from jobcar.keys import QueueKeys
from jobcar.outcome import Outcome

#: The route of one attempt under the handler's base URL; the job id is quoted into it.
ATTEMPT_PATH: Final = "/v1/attempts/"
#: How a handler is told where its attempt is and what proves it: HTTP request headers, a command's
#: environment, a batched job's fields (docs/handler-api.md).
URL_HEADER: Final = "Jobcar-Attempt-Url"
TOKEN_HEADER: Final = "Jobcar-Attempt-Token"
URL_ENV: Final = "JOBCAR_ATTEMPT_URL"
TOKEN_ENV: Final = "JOBCAR_ATTEMPT_TOKEN"
URL_FIELD: Final = "attempt_url"
TOKEN_FIELD: Final = "attempt_token"
#: A token's random bytes: 192 bits.
_TOKEN_BYTES: Final = 24
#: Reasons kept for attempts that ended, for the calls that come after.
_ENDED_KEPT: Final = 4096

#: Why a call about an attempt that no longer runs is refused (409).
ANSWERED: Final = "the attempt already answered"
LEASE_LOST: Final = "the attempt lost its lease"
CANCELED: Final = "the job was canceled"
STOPPED: Final = "the attempt was stopped"


class StderrSink(Protocol):
    """Takes a command's stderr lines as they come; `flush` returns once they are written."""

    def add(self, lines: list[str]) -> None: ...

    async def flush(self) -> None: ...


class Refused(Exception):
    """A call the handler API refuses: `status` 401 (no such attempt or not its token) or 409 (it ended)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(eq=False)
class LiveAttempt:
    """One running attempt, as its handler sees it."""

    keys: QueueKeys
    job: Job
    lease_token: str
    token: str
    url: str
    #: When the attempt times out (epoch seconds); extend moves it, up to `latest`.
    deadline: float
    latest: float
    #: Records an outcome for the attempt now (a snooze), as the attempt would once its handler answered.
    answer_now: Callable[[Outcome], Awaitable[bool]]
    #: The handler answered through the API (a snooze, waiting for its children): what its own answer says is
    #: ignored, and its lease is no longer renewed.
    answered: bool = False
    #: Where a command's stderr lines go as they come, when its handler has `log_stderr` (the job's log).
    stderr_lines: StderrSink | None = None
    #: The context the handler continues (`traceparent`, `TRACEPARENT`): the handler call's span while tracing
    #: is on (tracing.py); None: the job's own traceparent.
    traceparent: str | None = None
    _scope: asyncio.Timeout | None = field(default=None, repr=False)

    @property
    def extendable(self) -> bool:
        return self.latest > self.deadline

    def extend(self, seconds: float) -> float:
        """Move the deadline to `seconds` from now, never earlier than it was nor past `latest`; the new
        deadline. The running timeout (`bounded`) moves with it."""
        self.deadline = max(self.deadline, min(self.latest, time.time() + seconds))
        if self._scope is not None:
            self._scope.reschedule(_loop_time(self.deadline))
        return self.deadline

    @contextlib.asynccontextmanager
    async def bounded(self) -> AsyncIterator[None]:
        """A timeout at the attempt's deadline that follows it when extended (raises TimeoutError)."""
        async with asyncio.timeout_at(_loop_time(self.deadline)) as scope:
            self._scope = scope
            try:
                yield
            finally:
                self._scope = None


def _loop_time(epoch: float) -> float:
    return asyncio.get_running_loop().time() + (epoch - time.time())


class AttemptDesk:
    """The running attempts of this daemon, by job id."""

    def __init__(self) -> None:
        #: Where handlers reach this daemon's handler API (set once the listener is bound).
        self.base_url = ""
        #: The config the running attempts run under (the runner's, reloads included): the API's bounds.
        self.config: Config | None = None
        self._live: dict[str, LiveAttempt] = {}
        self._ended: OrderedDict[str, tuple[str, str]] = OrderedDict()  # job id -> (token, why)
        # Random bytes for the next tokens, read from the OS a few hundred at a time: a read per attempt would
        # be a system call on every job's path.
        self._random = b""
        self._taken = 0

    def open(
        self,
        keys: QueueKeys,
        job: Job,
        lease_token: str,
        *,
        deadline: float,
        latest: float,
        answer_now: Callable[[Outcome], Awaitable[bool]],
    ) -> LiveAttempt:
        token = self._token()
        url = self.base_url + ATTEMPT_PATH + quote(job.id, safe="")
        live = LiveAttempt(keys, job, lease_token, token, url, deadline, max(latest, deadline), answer_now)
        self._live[job.id] = live
        return live

    def _token(self) -> str:
        if self._taken + _TOKEN_BYTES > len(self._random):
            self._random, self._taken = secrets.token_bytes(_TOKEN_BYTES * 256), 0
        start, self._taken = self._taken, self._taken + _TOKEN_BYTES
        return base64.urlsafe_b64encode(self._random[start : self._taken]).decode()

    def close(self, live: LiveAttempt, why: str = ANSWERED) -> None:
        if self._live.get(live.job.id) is live:
            del self._live[live.job.id]
        self._ended[live.job.id] = (live.token, why)
        self._ended.move_to_end(live.job.id)
        if len(self._ended) > _ENDED_KEPT:
            self._ended.popitem(last=False)

    def find(self, job_id: str, token: str | None) -> LiveAttempt:
        """The attempt of `job_id` that `token` proves, or Refused: 401 for a token that is not this job's
        (another job's, an unknown one, none), 409 for an attempt that ended or answered."""
        live = self._live.get(job_id)
        if live is not None and token is not None and hmac.compare_digest(live.token.encode(), token.encode()):
            if live.answered:
                raise Refused(409, ANSWERED)
            return live
        ended = self._ended.get(job_id)
        if ended is not None and token is not None and hmac.compare_digest(ended[0].encode(), token.encode()):
            raise Refused(409, ended[1])
        raise Refused(401, "no running attempt of this job holds this token")
