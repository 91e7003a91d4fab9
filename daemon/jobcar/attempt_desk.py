"""The attempts a handler may call back: each running attempt's secret token, its deadline (which the
handler may move, within its handler's `max_extend`), and whether the handler already answered through
the handler API. The attempts (attempts.py) open and close them; the handler API (handler_api.py) finds
them here. Nothing here is stored in Redis: a handler calls the daemon that runs its attempt.

A token is 192 random bits, made per attempt, compared in constant time, and never logged or stored: it
is good for one job's one attempt, and only while that attempt runs here. An attempt stopped while its
handler may still run (canceled, its lease lost, a drain) keeps its reason for a while (`_STOPPED_KEPT` of
them), so the handler's next call hears why it is refused. One whose handler returned keeps nothing: its
handler calls no more, and remembering every finished attempt cost the daemon's every job (ADR 0023).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Final, Protocol
from urllib.parse import quote

from jobcar.config_types import Config
from jobcar.job import Job
from jobcar.keys import QueueKeys
from jobcar.outcome import Outcome
from jobcar.transitions import LeasedJob

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
#: A token's random bytes: 192 bits, as 32 characters of URL-safe base64 (no padding: 24 bytes are 32 whole
#: characters, so a run of tokens encoded at once is cut into tokens). Short: it goes out with every job.
_TOKEN_BYTES: Final = 24
_TOKEN_CHARS: Final = _TOKEN_BYTES * 4 // 3
_TOKENS_MADE: Final = 256
#: A job id made only of these characters goes into its attempt's URL as it is; quoting costs every job's path.
_NEEDS_NO_QUOTING: Final = re.compile(r"[A-Za-z0-9_.~-]+").fullmatch
#: Reasons kept for attempts stopped early, for the calls their handlers make after.
_STOPPED_KEPT: Final = 4096

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


class LiveAttempt:
    """One attempt as its handler sees it. The attempts' own record of a running job is one (attempts.py's
    RunningJob): the desk fills in the handler API's fields when the handler is called, so a handler that
    never calls back costs its job no object of its own. A slotted class with every field set in `__init__`:
    one is made for every job, and its fields are read at every step of the attempt."""

    __slots__ = ("_scope", "answered", "deadline", "job", "keys", "latest", "leased", "stderr_lines", "stopped",
                 "token", "traceparent", "url")  # fmt: skip

    def __init__(self, leased: LeasedJob, keys: QueueKeys) -> None:
        self.leased = leased
        self.job: Job = leased.job
        self.keys = keys
        #: Set when the attempt is opened (`AttemptDesk.open`): what the handler is given to call back.
        self.token = ""
        self.url = ""
        #: When the attempt times out (epoch seconds); extend moves it, up to `latest`.
        self.deadline = 0.0
        self.latest = 0.0
        #: The handler answered through the API (a snooze, waiting for its children): what its own answer says
        #: is ignored, and its lease is no longer renewed.
        self.answered = False
        #: Why it takes no more calls although its handler may still run (canceled, lease lost, a drain).
        self.stopped: str | None = None
        #: Where a command's stderr lines go as they come, when its handler has `log_stderr` (the job's log).
        self.stderr_lines: StderrSink | None = None
        #: The context the handler continues (`traceparent`, `TRACEPARENT`): the handler call's span while
        #: tracing is on (tracing.py); None: the job's own traceparent.
        self.traceparent: str | None = None
        self._scope: asyncio.Timeout | None = None

    @property
    def lease_token(self) -> str:
        return self.leased.token

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


async def _unanswerable(live: LiveAttempt, outcome: Outcome) -> bool:
    return False


class AttemptDesk:
    """The running attempts of this daemon as their handlers call them: found among the attempts' own
    (`running`, which the attempts hand over), so that an attempt whose handler never calls back costs its job
    no entry of its own here, only a token and a URL."""

    def __init__(self) -> None:
        #: Where handlers reach this daemon's handler API (set once the listener is bound).
        self.base_url = ""
        #: The config the running attempts run under (the runner's, reloads included): the API's bounds.
        self.config: Config | None = None
        #: The attempts running here (attempts.py's table, by queue and job id).
        self.running: Mapping[tuple[str, str], LiveAttempt] = {}
        #: Records an outcome for a running attempt now (a snooze, waiting for its children), as the attempt would
        #: once its handler answered; False when it could not (the lease was lost). Set by the attempts.
        self.answer_now: Callable[[LiveAttempt, Outcome], Awaitable[bool]] = _unanswerable
        self._stopped: OrderedDict[str, tuple[str, str]] = OrderedDict()  # job id -> (token, why)
        # The next tokens, made from the OS's random bytes a few hundred at a time: a read per attempt would be
        # a system call on every job's path.
        self._tokens: list[str] = []

    def open(self, live: LiveAttempt, deadline: float, latest: float) -> None:
        """Make `live` callable by its handler, from now until it leaves `running` or is `stop`ped: its token,
        its URL, its deadline."""
        job_id = live.job.id
        if not self._tokens:
            made = base64.urlsafe_b64encode(secrets.token_bytes(_TOKEN_BYTES * _TOKENS_MADE)).decode()
            self._tokens = [made[i : i + _TOKEN_CHARS] for i in range(0, len(made), _TOKEN_CHARS)]
        live.token = self._tokens.pop()
        live.url = self.base_url + ATTEMPT_PATH + (job_id if _NEEDS_NO_QUOTING(job_id) else quote(job_id, safe=""))
        live.deadline = deadline
        live.latest = max(latest, deadline)

    def stop(self, live: LiveAttempt, why: str) -> None:
        """The attempt was stopped while its handler may still run: that handler's calls hear `why` (409), now
        and for a while after the attempt left `running`."""
        live.stopped = why
        self._stopped[live.job.id] = (live.token, why)
        self._stopped.move_to_end(live.job.id)
        if len(self._stopped) > _STOPPED_KEPT:
            self._stopped.popitem(last=False)

    def find(self, job_id: str, token: str | None) -> LiveAttempt:
        """The attempt of `job_id` that `token` proves, or Refused: 401 for a token that is not this job's
        (another job's, an unknown one, none, an attempt whose handler returned), 409 for an attempt that was
        stopped or answered through the API. Looks through the running attempts (as many as the daemon's
        concurrency: a few µs per hundred), which only the handler API's calls pay for."""
        presented = (token or "").encode()
        for live in self.running.values():
            if live.token and live.job.id == job_id and hmac.compare_digest(live.token.encode(), presented):
                if live.stopped is not None:
                    raise Refused(409, live.stopped)
                if live.answered:
                    raise Refused(409, ANSWERED)
                return live
        stopped = self._stopped.get(job_id)
        if stopped is not None and hmac.compare_digest(stopped[0].encode(), presented):
            raise Refused(409, stopped[1])
        raise Refused(401, "no running attempt of this job holds this token")
