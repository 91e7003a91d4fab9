"""The daemon's link to Redis: its clients, whether Redis answers, and one `call()` that every loop sends
through.

`RedisLink.call` owns what each call needs around it: the guard that lets a recovery abandon a call
lost in an outage, the report that Redis answered (`Reachability.ok`), and on failure the count, the
log line and the backoff (`Reachability.failed`), after which it raises RedisUnavailable for the caller
to decide what comes next. Outcomes of jobs finishing together share one round trip (`CallBatcher`),
which guards each round trip and reports each answer itself: a finished job awaits the batcher's future
with no `call()` around it, the one measured exception (ADR 0006).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from jobcar.hiredis_packing import use_hiredis_packing
from jobcar.redis_url import is_sentinel_url
from jobcar.scripts import Reply, ScriptCall
from jobcar.sentinel import async_sentinel_client
from jobcar.transitions import coalesce, split_reply
from jobcar.transport import COMMAND_TIMEOUT, AsyncRedis, execute_async

log = logging.getLogger("jobcar.redis")

T = TypeVar("T")

#: Errors that mean "Redis did not do it": unreachable, or refusing (OOM, READONLY after a failover,
#: CLUSTERDOWN, a script stopped by a key of the wrong type...). The daemon backs off and tries again; it
#: never exits because of them.
REDIS_ERRORS: Final = (redis.exceptions.RedisError, OSError)
#: Refusals that pass like an outage: a failover or a cluster reconfiguring (READONLY, CLUSTERDOWN,
#: MASTERDOWN, TRYAGAIN, MOVED, ASK), a server loading its data or busy with a script. Any other error reply is Redis
#: answering "no" to this call (out of memory, a key of the wrong type, an ACL): not an outage.
_TRANSIENT_REPLIES: Final = (
    redis.exceptions.MovedError,  # a slot moving in a cluster (redis-py retries these itself first)
    redis.exceptions.AskError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.BusyLoadingError,
)
_TRANSIENT_CODES: Final = ("BUSY ", "MASTERDOWN ", "LOADING ", "NOREPLICAS ")
#: The pause after a refusal before the same call is tried again (seconds): Redis answered, so a quicker
#: reconnect would change nothing.
REFUSED_PAUSE: Final = 1.0
#: Redis errors are retried with jittered backoff between these bounds (seconds).
RECONNECT_MIN, RECONNECT_MAX = 0.05, 5.0
#: After an outage, a call sent before Redis answered again and still unanswered this long is abandoned.
STALE_CALL_GRACE: Final = 1.0


class RedisUnavailable(Exception):
    """Redis failed a call made through `RedisLink.call`; the failure was counted, logged and backed off."""


class RedisRefused(RedisUnavailable):
    """Redis answered a call made through `RedisLink.call` with an error that is not an outage: counted,
    logged once and paced, with Redis still reachable."""


def is_refusal(exc: BaseException) -> bool:
    """True when `exc` is Redis answering "no" (see _TRANSIENT_REPLIES), not Redis being away."""
    if not isinstance(exc, redis.exceptions.ResponseError) or isinstance(exc, _TRANSIENT_REPLIES):
        return False
    return not str(exc).startswith(_TRANSIENT_CODES)


def naming_key(reply: T, key: str, expected: str) -> T | redis.exceptions.ResponseError:
    """`reply`, or for Redis's own WRONGTYPE error (which names no key) one that names `key` and the type
    jobcar `expected` there, as the scripts' refusals do (lua/includes/wrong_type.lua): what the log says."""
    if isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith("WRONGTYPE Operation"):
        return redis.exceptions.ResponseError(
            f"WRONGTYPE jobcar: {key} holds another type, not a {expected}; jobcar fsck finds it and repairs it"
        )
    return reply


def connect(url: str, *, cluster: bool, blocking_wait: float = 0.0) -> AsyncRedis:
    """A client for the daemon. `blocking_wait`: the longest blocking command it sends (its reads outlast it)."""
    options = {
        "socket_timeout": COMMAND_TIMEOUT + blocking_wait,
        "socket_connect_timeout": COMMAND_TIMEOUT,
        "health_check_interval": 30,
        # No silent retries inside redis-py: a replayed lease or enqueue is not idempotent, and a
        # heartbeat stuck in retries would let a lease expire unnoticed. The daemon's loops retry.
        "retry": Retry(NoBackoff(), 0),
        # RESP2 (the default before redis-py 8; the scripts reply the same either way). redis-py 8.1's
        # asyncio pool, under RESP3, skips its check-out probe for connections the server closed
        # while they sat idle (redis-py #4252, fixed by #4260 after 8.1.0): after every Redis restart
        # each idle pooled connection then failed one command, and the daemon reported a second
        # outage for it. Under RESP2 the probe runs, and a dead connection is replaced unseen.
        "protocol": 2,
    }
    if cluster:
        # Cluster nodes pick their connection class themselves: redis-py's packing there.
        return redis.asyncio.RedisCluster.from_url(url, **options)
    if is_sentinel_url(url):
        # Sentinel's connections are redis-py's own class, which finds the primary: redis-py's packing there.
        return async_sentinel_client(url, **options)
    client = redis.asyncio.Redis.from_url(url, **options)  # type: ignore[arg-type]
    use_hiredis_packing(client)
    return client


@dataclass
class Reachability:
    """Logs one line per change between reachable and unreachable, and paces reconnect attempts.

    A call sent before Redis last answered may still time out afterwards (its reply was lost in the
    outage, and each connection times out on its own): pass its send time, and such a stale failure
    says nothing new about Redis, so it neither logs nor flips the state.

    Recovery is shared between the loops: the first one to see Redis answer again (`ok` after an
    outage) wakes every loop waiting in `pause` (backing off, or the reaper between passes), calls
    `on_recovery`, and abandons the calls made inside `guard()` that were sent before that answer and
    are still waiting STALE_CALL_GRACE later. Without this, a loop whose command went into a network
    blackhole waits out its socket timeout (10 s, 15 s for BLMOVE), and one whose backoff has grown
    sleeps up to RECONNECT_MAX, long after Redis is back.
    """

    reachable: bool = True
    #: Redis refuses what would grow it (maxmemory reached under noeviction). Set by a refusal, cleared by
    #: `writes_accepted` (the history's flush is refused while it lasts: its success says it ended).
    out_of_memory: bool = False
    failures: int = 0
    on_failure: Callable[[], None] | None = None
    on_recovery: Callable[[], None] | None = None
    last_ok: float = 0.0
    _last_refusal: str = ""  # a refusal is logged when it differs from the one before
    _recovered: asyncio.Event = field(default_factory=asyncio.Event)
    _in_flight: dict[asyncio.Timeout, float] = field(default_factory=dict)  # guarded calls -> send time

    def ok(self, sent_at: float | None = None) -> None:
        """Redis answered a call sent at `sent_at` (monotonic; default now)."""
        if not self.reachable:
            log.warning("redis reachable again")
            self._recovered.set()  # wakes the loops in pause()
            self._recovered = asyncio.Event()
            self._expire_stale_calls(time.monotonic() if sent_at is None else sent_at)
            if self.on_recovery is not None:
                self.on_recovery()
        self.reachable, self.failures, self.last_ok = True, 0, time.monotonic()

    async def refused(self, exc: BaseException, sent_at: float | None = None, deadline: float | None = None) -> None:
        """A refusal (`is_refusal`), through `failed`: counted, logged when new, and paced. Redis answered,
        so it is reachable: no "unreachable" line, and no reconnect backoff."""
        self.ok(sent_at)
        self.note_refusal(exc)
        delay = REFUSED_PAUSE if deadline is None else min(REFUSED_PAUSE, max(0.0, (deadline - time.monotonic()) / 2))
        await asyncio.sleep(delay)

    def note_refusal(self, exc: BaseException) -> None:
        """Count a refusal and log it when it differs from the last one (out of memory: once until it ends)."""
        if self.on_failure is not None:
            self.on_failure()
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            if not self.out_of_memory:
                log.error("redis is out of memory (maxmemory): new jobs are refused; the jobs stored run on, "
                          "without keeping their results, until memory is freed or maxmemory raised")  # fmt: skip
            self.out_of_memory = True
        elif str(exc) != self._last_refusal:
            log.error("redis refused a call: %s", exc)
            self._last_refusal = str(exc)

    def writes_accepted(self) -> None:
        """A write that Redis refuses when it is out of memory was accepted."""
        if self.out_of_memory:
            log.warning("redis accepts new writes again: it is no longer out of memory")
        self.out_of_memory = False

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if Redis is seen to answer again after an outage meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._recovered.wait()

    def _expire_stale_calls(self, answered_sent_at: float) -> None:
        # A call sent before the one Redis just answered, still waiting, most likely went into the outage:
        # its request or its reply is lost. The grace lets a paused server (SIGSTOP, a long fork) answer
        # everything it buffered, which it does at once when it resumes; after it, the call ends with a
        # TimeoutError (redis-py drops the connection of a cancelled command) and its loop retries at once.
        when = asyncio.get_running_loop().time() + STALE_CALL_GRACE
        for timeout, sent in self._in_flight.items():
            due = timeout.when()
            if sent < answered_sent_at and not timeout.expired() and (due is None or due > when):
                timeout.reschedule(when)

    @contextlib.asynccontextmanager
    async def guard(self, time_limit: float | None = None) -> AsyncIterator[None]:
        """Wrap one Redis call so that a recovery seen by another loop can abandon it (see `ok`); it also
        ends after `time_limit` seconds, when given."""
        sent = time.monotonic()
        async with asyncio.timeout(time_limit) as timeout:
            self._in_flight[timeout] = sent
            try:
                yield
            finally:
                del self._in_flight[timeout]

    async def failed(self, exc: BaseException, sent_at: float | None = None, deadline: float | None = None) -> None:
        """Count a failed call and back off. `deadline` (monotonic): the caller must try again before then,
        however long the backoff has grown (it races a lease); it sleeps at most half the time left."""
        if is_refusal(exc):
            await self.refused(exc, sent_at, deadline)
            return
        if self.on_failure is not None:
            self.on_failure()
        if sent_at is not None and sent_at < self.last_ok:
            await asyncio.sleep(RECONNECT_MIN)
            return
        if self.reachable:
            log.error("redis unreachable or refusing, retrying with backoff: %s", exc or type(exc).__name__)
        self.reachable = False
        # One counter for every loop: the backoff grows with the failures of all of them, so the whole
        # daemon's reconnect rate stays bounded however many jobs are waiting to record an outcome.
        self.failures += 1
        ceiling = min(RECONNECT_MAX, RECONNECT_MIN * 2 ** min(self.failures, 10))
        delay = random.uniform(RECONNECT_MIN, ceiling)
        if deadline is not None:
            delay = min(delay, max(RECONNECT_MIN, (deadline - time.monotonic()) / 2))
        await self.pause(delay)


class CallBatcher:
    """Coalesces script calls made by many tasks into one pipeline per round trip.

    While one batch is on the wire, new calls wait and go together in the next one: under load a
    round trip carries many calls (one per finished job, those of a queue merged into one by
    `transitions.coalesce`), and an idle daemon still sends each call at once. A connection failure
    fails every call of its batch; callers retry as they would alone.
    """

    def __init__(self, client: AsyncRedis, reachability: Reachability) -> None:
        self.client = client
        # Its guard is entered around each round trip: it abandons a batch sent into an outage once Redis
        # answers again, so the calls queued behind it need not wait for their timeout. Each answered round
        # trip is reported to it once, for every call it carried.
        self.reachability = reachability
        self._waiting: list[tuple[ScriptCall, asyncio.Future[Reply]]] = []
        self._sender: asyncio.Task[None] | None = None

    def call(self, script_call: ScriptCall) -> asyncio.Future[Reply]:
        """Queue a call; await the returned future for its reply. A plain function on purpose: every
        finished job awaits one, and a coroutine around the future would be one more layer to create and
        resume per job (ADR 0006)."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting.append((script_call, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="script call batcher")
        return future

    async def _send(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            sent = coalesce([c for c, _ in batch])
            sent_at = time.monotonic()
            try:
                async with self.reachability.guard():
                    replies = await execute_async(self.client, [c for c, _ in sent], raise_on_error=False)
                self.reachability.ok(sent_at)
            except Exception as exc:
                replies = [exc] * len(sent)
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            for (sent_call, positions), reply in zip(sent, replies, strict=True):
                for position, own in zip(positions, split_reply(sent_call, reply, len(positions)), strict=True):
                    future = batch[position][1]
                    if future.done():
                        continue  # its caller was cancelled meanwhile
                    if isinstance(own, Exception):
                        future.set_exception(own)
                    else:
                        future.set_result(own)


class RedisLink:
    """The daemon's clients and the one way its loops call Redis.

    `client` runs commands and scripts; `blocking_client` only serves the watchers' BLMOVE calls (one
    blocked connection per idle queue), so they never hold up a pool the rest of the daemon needs.
    """

    def __init__(
        self, client: AsyncRedis, blocking_client: AsyncRedis, on_failure: Callable[[], None] | None = None
    ) -> None:
        self.client = client
        self.blocking_client = blocking_client
        self.reachability = Reachability(on_failure=on_failure)
        self.batcher = CallBatcher(client, self.reachability)

    async def call(
        self,
        send: Callable[[], Awaitable[T]],
        *,
        guard: bool = True,
        time_limit: float | None = None,
        deadline: float | None = None,
    ) -> T:
        """`send()`'s result, reported to Reachability. On a Redis error: counted, logged and backed off
        (`deadline` bounds the backoff), then RedisUnavailable. `guard=False` for a call that must not be
        abandoned at a recovery; `time_limit` bounds the whole send (seconds)."""
        sent = time.monotonic()
        try:
            # Contexts only where asked for: an outcome call (every finished job) enters none of them, and an
            # asyncio.timeout costs a request a third more CPU (ADR 0006).
            if guard:
                async with self.reachability.guard(time_limit):
                    result = await send()
            elif time_limit is not None:
                async with asyncio.timeout(time_limit):
                    result = await send()
            else:
                result = await send()
        except REDIS_ERRORS as exc:  # asyncio's TimeoutError is an OSError too
            await self.reachability.failed(exc, sent_at=sent, deadline=deadline)
            if is_refusal(exc):
                raise RedisRefused(str(exc)) from exc
            raise RedisUnavailable(str(exc) or type(exc).__name__) from exc
        self.reachability.ok(sent)
        return result

    def scripts(
        self, calls: Sequence[ScriptCall], *, guard: bool = True, each_its_own: bool = False
    ) -> Awaitable[list[Reply]]:
        """Script calls in one round trip, through `call` (its coroutine, returned as it is: the lease step
        pays no second coroutine layer). `each_its_own`: a call's refusal (`is_refusal`) is its reply, noted
        with `Reachability.note_refusal`, and the others' replies stand: one queue's bad key does not fail
        the calls made for the other queues."""
        if not each_its_own:
            return self.call(functools.partial(execute_async, self.client, calls), guard=guard)
        return self.call(functools.partial(self._execute_each_its_own, calls), guard=guard)

    async def _execute_each_its_own(self, calls: Sequence[ScriptCall]) -> list[Reply]:
        replies = await execute_async(self.client, calls, raise_on_error=False)
        outage = self.note_refusals(replies)
        if outage is not None:
            raise outage  # inside `call`: counted, logged and backed off as the outage it is
        return replies

    def note_refusals(self, replies: Sequence[Reply]) -> BaseException | None:
        """Note each refusal among the replies of calls made for different queues; the first error among
        them that is an outage (a failover's READONLY, say), for the caller to raise once it has used the
        replies that stand."""
        outage = None
        for reply in replies:
            if isinstance(reply, Exception):
                if is_refusal(reply):
                    self.reachability.note_refusal(reply)
                elif outage is None:
                    outage = reply
        return outage

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.blocking_client.aclose()
