"""The daemon's loop: lease jobs with backpressure, run them through executors, renew their leases,
recover expired ones, and drain on shutdown.

The runner knows Outcomes, not HTTP or processes (those are the executors'), and it changes job state
only through the store's scripts. Its background loops are named tasks made by `spawn`, which logs
and survives their exceptions (CONVENTIONS: every loop survives a bad moment of Redis).

Leasing: a queue is "ready" until a lease finds it empty; then a watcher task blocks on the queue's
wake list (ADR 0002) and marks it ready again when work appears, and a timer does so when the
earliest scheduled job is due. On a daemon with one queue the watcher sends a lease behind its wait,
which Redis runs as soon as the wait ends (ADR 0005). The daemon never asks for more jobs than it has
free slots: a lease waiting behind a watcher holds its slots until its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

import redis.asyncio
import redis.exceptions
from redis.asyncio.connection import AbstractConnection

from jobcar import store
from jobcar.backoff import retry_delay
from jobcar.config_types import Config, Handler
from jobcar.executors import Executor
from jobcar.job import Job, State
from jobcar.metrics import Metrics
from jobcar.outcome import Outcome, OutcomeKind
from jobcar.store import DeadLetterLimits, ExtendStatus, LeasedJob, QueueKeys, RetryResult, ScriptCall

log = logging.getLogger("jobcar.runner")

#: Most jobs one lease call takes (bounded by free slots too): big batches amortise round trips,
#: small ones keep one call short.
LEASE_BATCH_MAX: Final = 100
#: An idle queue is leased from at least this often even if no wake came (a lost wake, a paused
#: queue's lease script): the bound on idle Redis traffic is 2 commands per this many seconds.
IDLE_WAIT_MAX: Final = 5.0
#: How many times a job may give its attempt back (429/503 + Retry-After) over its life.
MAX_FREE_RETRIES: Final = 20
#: Redis errors are retried with jittered backoff between these bounds (seconds).
RECONNECT_MIN, RECONNECT_MAX = 0.05, 5.0
#: After an outage, a call sent before Redis answered again and still unanswered this long is abandoned.
STALE_CALL_GRACE: Final = 1.0
#: A watcher leaves a scheduled job due within its wait (plus this margin) to the daemon's timer: Redis
#: ends a BLMOVE on timeout only at its next cron tick (100 ms apart at the default hz 10).
DUE_MARGIN: Final = 1.0
#: At a drain, how long the daemon waits for the replies of leases still queued behind watchers' waits.
DRAIN_WAKE_MAX: Final = 2.0
#: Errors that mean "Redis did not do it": unreachable, or refusing (OOM, READONLY after a failover,
#: CLUSTERDOWN...). The daemon backs off and tries again; it never exits because of them.
REDIS_ERRORS: Final = (redis.exceptions.RedisError, OSError)
#: The level of the line each finished attempt logs. Successes at debug: at thousands of jobs/s a line
#: per job would cost more than the job. The error text (a handler's stderr or response body may echo
#: the payload) is logged at debug only, whatever the outcome.
_LOG_LEVELS: Final = {
    OutcomeKind.SUCCESS: logging.DEBUG,
    OutcomeKind.RETRY: logging.INFO,
    OutcomeKind.FAIL: logging.WARNING,
}


class HealthGate(Protocol):
    """The app's health, by URL (health.AppHealth); None stands for "no health URL": always healthy."""

    def healthy(self, url: str | None) -> bool: ...

    async def wait(self, url: str | None) -> None: ...


class AlwaysHealthy:
    def healthy(self, url: str | None) -> bool:
        return True

    async def wait(self, url: str | None) -> None:
        return None


class StopReason(StrEnum):
    CANCELED = "canceled by an operator"
    LEASE_LOST = "lease lost"
    SHUTDOWN = "returned to pending: the daemon is shutting down"
    APP_UNHEALTHY = "returned to pending: the app is unhealthy"


def log_fields(job: Job) -> dict[str, object]:
    """The fields every log line about one attempt carries; built only when a line is logged."""
    return {"queue": job.queue, "job_id": job.id, "type": job.type, "attempt": job.attempt}


@dataclass
class RunningJob:
    leased: LeasedJob
    keys: QueueKeys
    last_renewed: float = field(default_factory=time.monotonic)
    stop_reason: StopReason | None = None
    task: asyncio.Task[None] | None = None

    @property
    def job(self) -> Job:
        return self.leased.job


@dataclass
class QueueState:
    keys: QueueKeys
    weight: int
    ready: bool = True
    due_at: float | None = None  # monotonic time when its earliest scheduled job is due
    went_idle: asyncio.Event = field(default_factory=asyncio.Event)
    reserved: int = 0  # slots held by a lease waiting behind the watcher's BLMOVE

    def idle(self, next_due_ms: int | None) -> None:
        self.ready = False
        self.due_at = None if next_due_ms is None else time.monotonic() + next_due_ms / 1000
        self.went_idle.set()

    def runnable(self, now: float) -> bool:
        return self.ready or (self.due_at is not None and self.due_at <= now)


@dataclass
class RedisHealth:
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
    failures: int = 0
    on_failure: Callable[[], None] | None = None
    on_recovery: Callable[[], None] | None = None
    last_ok: float = 0.0
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
            if sent < answered_sent_at and not timeout.expired():
                timeout.reschedule(when)

    @contextlib.asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """Wrap one Redis call so that a recovery seen by another loop can abandon it (see `ok`)."""
        sent = time.monotonic()
        async with asyncio.timeout(None) as timeout:
            self._in_flight[timeout] = sent
            try:
                yield
            finally:
                del self._in_flight[timeout]

    async def failed(self, exc: BaseException, sent_at: float | None = None, deadline: float | None = None) -> None:
        """Count a failed call and back off. `deadline` (monotonic): the caller must try again before then,
        however long the backoff has grown (it races a lease); it sleeps at most half the time left."""
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


def spawn(name: str, work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> asyncio.Task[None]:
    """Start a named background task; keep a strong reference and log how it ended."""
    task = asyncio.create_task(work, name=name)
    tasks.add(task)

    def done(t: asyncio.Task[None]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("task %s failed", name, exc_info=t.exception())

    task.add_done_callback(done)
    return task


def current_task_cancelling() -> bool:
    """True when the current task was asked to cancel. redis-py sends through `asyncio.wait_for`, which
    on Python 3.11 swallows a cancel landing just as the command completes (the call returns normally),
    so a loop must check for a pending cancel itself or it can run on after shutdown cancelled it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def forever(name: str, step: Callable[[], Awaitable[None]], health: RedisHealth) -> None:
    """Run `step` in a loop that survives Redis outages and logs anything else without dying.
    Steps report success to `health` themselves, right after Redis answered them."""
    while True:
        if current_task_cancelling():
            raise asyncio.CancelledError  # a cancel redis-py swallowed (see `current_task_cancelling`)
        try:
            await step()
        except REDIS_ERRORS as exc:
            await health.failed(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: unexpected error; continuing", name)
            await asyncio.sleep(1)


class Runner:
    """Runs jobs from the configured queues until `drain()` is called and in-flight work is settled.

    `client` runs commands and scripts; `blocking_client` only serves the watchers' BLMOVE calls (one
    blocked connection per idle queue), so they never hold up a pool the rest of the daemon needs.
    """

    def __init__(
        self,
        config: Config,
        client: store.AsyncRedis,
        blocking_client: store.AsyncRedis,
        executors: Mapping[str, Executor],
        health: HealthGate | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.client = client
        self.metrics = metrics or Metrics(config)
        self.app_health = health or AlwaysHealthy()
        self.blocking_client = blocking_client
        # Outcomes of jobs finishing together share a round trip.
        self.health = RedisHealth(on_failure=self.metrics.redis_errors.inc, on_recovery=self._redis_recovered)
        self.outcomes = store.CallBatcher(client, guard=self.health.guard)
        self.running: dict[tuple[str, str], RunningJob] = {}
        # Every job task until it has recorded its outcome (running only holds those still executing).
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._returned_on_shutdown = 0
        self._reap_failed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._draining = asyncio.Event()
        self._type_slots: dict[str, tuple[int, asyncio.Semaphore]] = {}
        self.queues = [QueueState(QueueKeys.of(config.namespace, q), w) for q, w in config.queues.items()]
        # ADR 0005: a one-queue daemon queues a lease behind its idle wait, guarded by its alive key.
        self._leases_behind_waits = len(self.queues) == 1
        self._daemon_id = secrets.token_hex(8)
        self._alive_until = 0.0  # monotonic time until which the alive key surely exists
        self._wait_connection: AbstractConnection | None = None
        self.apply(config, executors)

    # -- configuration ------------------------------------------------------------------------

    def apply(self, config: Config, executors: Mapping[str, Executor]) -> None:
        """Take a (re)loaded config's handlers. Running jobs finish with the executor they started with."""
        self.config = config
        self.handlers: Mapping[str, Handler] = config.handlers
        self.executors = dict(executors)
        self.metrics.configure(config)
        self._max_attempts_by_type = json.dumps({t: h.max_attempts for t, h in config.handlers.items()})
        self._dead = DeadLetterLimits(config.dead_letter.max_jobs, int(config.dead_letter.max_age * 1000))
        slots: dict[str, tuple[int, asyncio.Semaphore]] = {}
        for job_type, handler in config.handlers.items():
            if handler.concurrency is not None:
                kept = self._type_slots.get(job_type)
                if kept is None or kept[0] != handler.concurrency:  # a reload may change the limit
                    kept = (handler.concurrency, asyncio.Semaphore(handler.concurrency))
                slots[job_type] = kept
        self._type_slots = slots
        self._changed.set()

    @property
    def lease_ms(self) -> int:
        return int(self.config.lease * 1000)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Lease and run jobs until drain() is called, then settle in-flight jobs and return."""
        for q in self.queues:
            name = f"watch {q.keys.queue}"
            spawn(name, forever(name, functools.partial(self._watch, q), self.health), self._tasks)
        spawn("heartbeat", forever("heartbeat", self._heartbeat, self.health), self._tasks)
        spawn("reaper", forever("reaper", self._reap, self.health), self._tasks)
        try:
            while not self._draining.is_set():
                try:
                    await self._lease_step()
                except REDIS_ERRORS as exc:
                    await self.health.failed(exc)
                except Exception:
                    # A bug must not end the daemon with jobs in flight: say so loudly and go on.
                    log.exception("lease loop: unexpected error; continuing")
                    await asyncio.sleep(1)
            await self._collect_leases_on_wake()
            await self._settle()
        finally:
            # Cancel until every task is gone: a cancel swallowed inside redis-py (see
            # `current_task_cancelling`) can leave a task waiting on an event nobody will set.
            pending = set(self._tasks)
            while pending:
                for task in pending:
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=1)
            if self._wait_connection is not None and isinstance(self.blocking_client, redis.asyncio.Redis):
                await self.blocking_client.connection_pool.release(self._wait_connection)

    def drain(self) -> None:
        """Stop leasing; run() then waits up to shutdown_timeout for in-flight jobs (DESIGN §4)."""
        if not self._draining.is_set():
            log.info("no more leases; %d jobs in flight", len(self.running))
        self._draining.set()
        self._changed.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def stop_now(self) -> None:
        """The second signal: give every in-flight job back now instead of waiting for it."""
        self.drain()
        for running in list(self.running.values()):
            self._stop(running, StopReason.SHUTDOWN)

    async def _settle(self) -> None:
        started = time.monotonic()
        in_flight = len(self.running)
        if self._job_tasks:
            await asyncio.wait(set(self._job_tasks), timeout=self.config.shutdown_timeout)
        for running in list(self.running.values()):
            self._stop(running, StopReason.SHUTDOWN)
        if self._job_tasks:
            # Executors stop handlers (TERM, grace, KILL) before their task ends; each task then gives
            # its job back, or gives up once its lease would have expired.
            await asyncio.wait(set(self._job_tasks))
        log.info(
            "drained %d jobs in %.1f s, %d returned to pending",
            in_flight,
            time.monotonic() - started,
            self._returned_on_shutdown,
        )

    # -- leasing ------------------------------------------------------------------------------

    async def _lease_step(self) -> None:
        self._changed.clear()
        if not self.app_health.healthy(self.config.health_url):
            # The app is not up: jobs wait in Redis, where another daemon (or later we) can run them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.app_health.wait(self.config.health_url), 1.0)
            return
        free = self.config.concurrency - len(self.running) - sum(q.reserved for q in self.queues)
        now = time.monotonic()
        candidates = [q for q in self.queues if q.runnable(now)]
        if free <= 0 or not candidates:
            dues = [q.due_at - now for q in self.queues if q.due_at is not None and not q.ready]
            timeout = max(0.0, min(dues)) if dues and free > 0 else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
            return
        queue = self._pick(candidates)
        count = min(free, LEASE_BATCH_MAX)
        call = self._lease(queue, count)
        sent = time.monotonic()
        try:
            async with self.health.guard():
                reply = (await store.execute_async(self.client, [call]))[0]
        except REDIS_ERRORS as exc:
            await self.health.failed(exc, sent_at=sent)
            return
        self.health.ok(sent)
        await self._take(queue, count, reply)

    def _lease(self, queue: QueueState, count: int, alive_key: str | None = None) -> ScriptCall:
        return store.lease_call(
            queue.keys, count, self.lease_ms, self.config.defaults.max_attempts, self._max_attempts_by_type, alive_key
        )

    async def _take(self, queue: QueueState, count: int, reply: store.Reply) -> None:
        """Start the jobs a lease of `count` returned, and mark the queue idle if it ran short."""
        result = store.parse_lease(queue.keys, reply)
        if result.declined:
            # Our alive key lapsed (a stalled heartbeat, a flushed or restarted server): plain waits until
            # a beat refreshes it; without this, a wake left in place would make every wait return at once.
            self._alive_until = 0.0
        series = self.metrics.of_queue(queue.keys.queue)
        series.leased.inc(len(result.jobs))
        for leased in result.jobs:
            series.wait.observe(max(0, result.now_ms - leased.job.ready_ms) / 1000)
            self._start(queue.keys, leased)
        if result.paused:
            queue.idle(None)  # resume pushes a wake; due jobs wait for it
        elif len(result.jobs) < count:
            # Empty (or emptied) for now: wait for a wake, or for the earliest scheduled job.
            queue.idle(result.next_due_ms)
        for job_id in result.missing:
            log.error("job id in pending list has no job hash; dropped from the list", extra={"job_id": job_id})
        for job_id, token, problem in result.malformed:
            log.error("malformed job hash; moved to the dead-letter queue", extra={"job_id": job_id})
            kill = store.kill_call(queue.keys, job_id, token, f"malformed job: {problem}", self._dead)
            await store.execute_async(self.client, [kill])

    def _redis_recovered(self) -> None:
        """Lease from every queue at once after an outage: jobs enqueued meanwhile are waiting, and the
        watchers' blocked calls (and the wakes they were waiting for) were most likely lost with it."""
        for queue in self.queues:
            queue.ready = True
        self._changed.set()

    def _pick(self, candidates: list[QueueState]) -> QueueState:
        if self.config.strict_priority or len(candidates) == 1:
            return candidates[0]
        return random.choices(candidates, weights=[q.weight for q in candidates])[0]

    async def _watch(self, queue: QueueState) -> None:
        """Block on the queue's wake list while it is idle, then mark it ready (ADR 0002), or, with a lease
        sent behind the wait, start what it leased (ADR 0005)."""
        await queue.went_idle.wait()
        count = self._lease_on_wake_count(queue)
        # IDLE_WAIT_MAX is whole seconds: redis-py types the timeout as int (the server takes decimals).
        wake, timeout = queue.keys.wake, int(IDLE_WAIT_MAX)
        sent = time.monotonic()
        try:
            with self._reserved(queue, count):
                async with self.health.guard():
                    if count:
                        call = self._lease(queue, count, alive_key=queue.keys.alive(self._daemon_id))
                        reply = await store.lease_on_wake(await self._wait_target(), wake, timeout, call)
                    else:
                        with store.closed_transport_is_connection_error():
                            await self.blocking_client.blmove(wake, wake, timeout, "RIGHT", "RIGHT")
                self.health.ok(sent)
                queue.went_idle.clear()
                queue.ready = True
                if count:
                    await self._take(queue, count, reply)
                    # Let the jobs just started send their requests before this task re-arms its wait:
                    # building that pipeline costs ~0.1 ms of Python, which would delay every pickup.
                    await asyncio.sleep(0)
        except REDIS_ERRORS as exc:
            await self.health.failed(exc, sent_at=sent)
            return  # the queue stays idle: the next pass blocks again

    async def _wait_target(self) -> store.AsyncRedis | AbstractConnection:
        """Where a one-queue daemon's watcher sends its wait and lease: a connection of its own, checked
        out of the blocking client's pool once (given back when the runner stops); on Cluster, the
        client (store.lease_on_wake)."""
        if not isinstance(self.blocking_client, redis.asyncio.Redis):
            return self.blocking_client
        pool = self.blocking_client.connection_pool
        if self._wait_connection is None:
            self._wait_connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        else:
            # The pool's check-out probe, kept: a connection the server closed while the queue was busy
            # (a restart) is replaced unseen, instead of failing its next wait as a second outage.
            await pool.ensure_connection(self._wait_connection)
        return self._wait_connection

    @contextlib.contextmanager
    def _reserved(self, queue: QueueState, count: int) -> Iterator[None]:
        """Hold `count` slots for a lease sent behind a wait, until its jobs are running or it failed."""
        queue.reserved = count
        try:
            yield
        finally:
            queue.reserved = 0
            self._changed.set()

    def _lease_on_wake_count(self, queue: QueueState) -> int:
        """How many jobs the watcher of an idle queue leases behind its wait; 0 for a plain wait.

        Only on a daemon with one queue: a lease waiting behind one queue's wait holds slots that another
        queue's jobs could need meanwhile. Only while the heartbeat keeps the alive key that guards it.
        Never while draining or while the app is unhealthy, and not when a scheduled job is due before
        the wait ends: the daemon's timer leases that one on time.
        """
        if not self._leases_behind_waits or self._alive_until <= time.monotonic():
            return 0
        if self._draining.is_set() or not self.app_health.healthy(self.config.health_url):
            return 0
        if queue.due_at is not None and queue.due_at < time.monotonic() + IDLE_WAIT_MAX + DUE_MARGIN:
            return 0
        return max(0, min(LEASE_BATCH_MAX, self.config.concurrency - len(self.running)))

    async def _collect_leases_on_wake(self) -> None:
        """At a drain, wake the watchers whose lease still waits behind their BLMOVE and take the replies:
        the lease runs whenever a wake comes, and cancelling the wait could drop a reply carrying jobs
        (they would sit leased until their lease expired). The jobs it took go straight back (`_check_may_start`).
        Extra elements on a wake list are harmless: the next lease that finds nothing pending deletes it."""
        waiting = [q for q in self.queues if q.reserved]
        if not waiting:
            return
        # The replies are awaited, not the wakes: a reply already on its way may arrive first.
        wakes = asyncio.gather(*(self.client.rpush(q.keys.wake, "1") for q in waiting), return_exceptions=True)
        try:
            async with asyncio.timeout(DRAIN_WAKE_MAX):
                while any(q.reserved for q in self.queues):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            # If the lease still runs, the reaper of any daemon recovers its jobs once their lease expires.
            log.warning("no reply from a lease sent behind a wait within %.0f s; exiting without it", DRAIN_WAKE_MAX)
        finally:
            wakes.cancel()
            await asyncio.wait([wakes])

    # -- running one job ----------------------------------------------------------------------

    def _start(self, keys: QueueKeys, leased: LeasedJob) -> None:
        key = (keys.queue, leased.job.id)
        earlier = self.running.get(key)
        if earlier is not None:
            # Our own earlier attempt lost its lease (reaped while we could not renew it) and the job
            # came back to us: that attempt must stop before this one runs.
            log.warning("job leased again while an earlier attempt runs; stopping that attempt",
                        extra={"queue": keys.queue, "job_id": leased.job.id})  # fmt: skip
            self._stop(earlier, StopReason.LEASE_LOST)
        running = RunningJob(leased, keys)
        self.running[key] = running
        self.metrics.of_queue(keys.queue).in_flight.inc()
        running.task = asyncio.create_task(self._run_job(running), name=f"job {leased.job.id}")
        self._job_tasks.add(running.task)
        running.task.add_done_callback(self._job_tasks.discard)

    def _stop(self, running: RunningJob, reason: StopReason) -> None:
        if running.stop_reason is None and running.task is not None:
            self._note_stop(running, reason)
            running.task.cancel()

    def _check_may_start(self, running: RunningJob) -> None:
        """Never start a handler after the drain began, nor while the app is unhealthy (a lease queued behind
        an idle wait takes jobs whenever they come, ADR 0005): the job goes back, its attempt returned, as
        if stopped. (Not `_stop`: cancelling its own task would also cancel the give-back call it makes.)"""
        if self._draining.is_set():
            reason = StopReason.SHUTDOWN
        elif not self.app_health.healthy(self.config.health_url):
            reason = StopReason.APP_UNHEALTHY
        else:
            return
        self._note_stop(running, reason)
        raise asyncio.CancelledError

    def _note_stop(self, running: RunningJob, reason: StopReason) -> None:
        """Say why the attempt ends early: its task then records that instead of an outcome."""
        running.stop_reason = reason
        if reason is StopReason.SHUTDOWN:
            self._returned_on_shutdown += 1

    def _forget(self, running: RunningJob) -> None:
        """The attempt no longer runs here (called once per attempt); its outcome may still be recorded."""
        key = (running.keys.queue, running.job.id)
        if self.running.get(key) is running:
            del self.running[key]
        self.metrics.of_queue(running.keys.queue).in_flight.dec()
        self._changed.set()

    async def _run_job(self, running: RunningJob) -> None:
        job = running.job
        if job.cancel_requested:
            # Canceled while an earlier attempt ran, which then failed or lost its daemon.
            self._forget(running)
            await self._finish(running, Outcome.success(), final=State.CANCELED)
            return
        started = time.monotonic()
        try:
            outcome = await self._execute(running)
        except asyncio.CancelledError:
            reason = running.stop_reason
            if reason is None:
                raise
            self._forget(running)
            log.info("job stopped: %s", reason.value, extra=log_fields(job))
            if reason is StopReason.CANCELED:
                await self._finish(running, Outcome.success(), final=State.CANCELED)
            elif reason in (StopReason.SHUTDOWN, StopReason.APP_UNHEALTHY):
                await self._finish(running, Outcome.retry(reason.value, after=0, spend_attempt=False), give_back=True)
            return
        except Exception as exc:
            log.exception("job failed inside jobcar", extra=log_fields(job))
            outcome = Outcome.retry(f"jobcar internal error: {exc!r}")
        self._forget(running)
        elapsed = time.monotonic() - started
        self.metrics.of_job(job.queue, job.type).duration.observe(elapsed)
        level = _LOG_LEVELS[outcome.kind]
        if log.isEnabledFor(level):
            fields = {**log_fields(job), "outcome": outcome.kind.value, "duration_s": round(elapsed, 6)}
            log.log(level, "job %s", outcome.kind.value, extra=fields)
            if outcome.error:
                log.debug("job %s: %s", outcome.kind.value, outcome.error, extra=fields)
        await self._finish(running, outcome)

    async def _execute(self, running: RunningJob) -> Outcome:
        job = running.job
        self._check_may_start(running)
        handler = self.handlers.get(job.type)
        executor = self.executors.get(job.type)
        if handler is None or executor is None:
            return Outcome.fail(f"no handler for type {job.type}")
        timeout = job.timeout_ms / 1000 if job.timeout_ms else handler.timeout
        max_attempts = job.max_attempts or handler.max_attempts
        limit = self._type_slots.get(job.type)
        if limit is None:
            return await executor.run(job, deadline=time.time() + timeout, max_attempts=max_attempts)
        # A job of a type at its concurrency limit waits here, holding one of the daemon's slots.
        async with limit[1]:
            self._check_may_start(running)
            return await executor.run(job, deadline=time.time() + timeout, max_attempts=max_attempts)

    async def _finish(
        self, running: RunningJob, outcome: Outcome, final: State = State.DONE, give_back: bool = False
    ) -> None:
        """Record the outcome. While Redis is away or refusing, keep trying until the lease would have
        expired: after that the job belongs to whoever reaps it (at-least-once)."""
        job, keys = running.job, running.keys
        call = self._outcome_call(keys, running.leased, outcome, final, give_back)
        while True:
            sent = time.monotonic()
            try:
                reply = await self.outcomes.call(call)
                self.health.ok(sent)
                break
            except REDIS_ERRORS as exc:
                expires = running.last_renewed + self.config.lease
                if time.monotonic() > expires:
                    log.error("could not record the outcome before the lease expired: %s", exc, extra=log_fields(job))
                    return
                # Never back off past the lease: once it expires the job is reaped and runs again, even
                # if Redis was back a moment after the outcome failed.
                await self.health.failed(exc, sent_at=sent, deadline=expires)
        recorded = self._recorded_as(call.script.name, reply, final, give_back)
        self.metrics.of_job(job.queue, job.type).finished[recorded].inc()
        if recorded == "lease_lost":
            why = "lease lost before the outcome was recorded; another daemon owns the job"
            log.warning(why, extra=log_fields(job))
        elif recorded == "dead" and call.script.name == "retry":
            log.warning("attempts exhausted; job moved to the dead-letter queue", extra=log_fields(job))

    @staticmethod
    def _recorded_as(script_name: str, reply: store.Reply, final: State, give_back: bool) -> str:
        """The metrics outcome (metrics.OUTCOMES) of an outcome call and its reply."""
        if reply == 0:
            return "lease_lost"
        if script_name == "ack":
            return final.value
        if script_name == "kill" or reply == RetryResult.DEAD:
            return "dead"
        return "returned" if give_back else "retried"

    def _outcome_call(
        self, keys: QueueKeys, leased: LeasedJob, outcome: Outcome, final: State, give_back: bool
    ) -> ScriptCall:
        job = leased.job
        if outcome.kind is OutcomeKind.SUCCESS:
            retention_ms = int(self.config.result_ttl * 1000)
            result = outcome.result if retention_ms else None
            return store.ack_call(keys, job.id, leased.token, result=result, retention_ms=retention_ms, final=final)
        if outcome.kind is OutcomeKind.FAIL:
            return store.kill_call(keys, job.id, leased.token, outcome.error or "failed", self._dead)
        delay = outcome.retry_after
        if delay is None:
            handler = self.handlers.get(job.type)
            backoff = handler.backoff if handler else self.config.defaults.backoff
            delay = retry_delay(backoff, job.attempt)
        return store.retry_call(
            keys,
            job.id,
            leased.token,
            delay_ms=int(delay * 1000),
            error=outcome.error or "retry",
            spend_attempt=outcome.spend_attempt,
            # A drain gives attempts back without limit: a restart must never cost a job its attempts.
            max_free_retries=0 if give_back else MAX_FREE_RETRIES,
            dead=self._dead,
        )

    # -- heartbeat and recovery ---------------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Renew the leases of jobs still in hand, every third of the lease. An attempt is abandoned
        (self-fencing) when its lease is lost, and also when it was not renewed for two thirds of the
        lease: it could expire before the next beat, and another daemon could then run the job too.

        On a daemon that leases behind its idle wait, each beat then refreshes its alive key, for two
        thirds of the lease: the key lapses before any lease the beat renewed, so a daemon frozen with a
        lease queued behind its wait cannot take the jobs a reaper returns from it (ADR 0005). The first
        beat is at start-up, so the key exists before the first idle wait."""
        interval = self.config.lease / 3
        by_queue: dict[str, list[RunningJob]] = {}
        for running in self.running.values():
            # Jobs being stopped still need their lease: they are given back or acked as canceled.
            if running.stop_reason is not StopReason.LEASE_LOST:
                by_queue.setdefault(running.keys.queue, []).append(running)
        groups = list(by_queue.values())
        sent = time.monotonic()
        calls = [store.extend_call(g[0].keys, self.lease_ms, [(r.job.id, r.leased.token) for r in g]) for g in groups]
        try:
            async with asyncio.timeout(interval):
                if calls:
                    replies = await store.execute_async(self.client, calls)
                    self.health.ok(sent)
                    self._renewed(groups, replies, sent)
                if self._leases_behind_waits:
                    await self._refresh_alive_key()
        except REDIS_ERRORS as exc:  # asyncio's TimeoutError is an OSError too
            # No backoff beyond the heartbeat's own pace (a beat per interval, each bounded by it): a
            # longer sleep would let the leases lapse (and the attempts be abandoned) after Redis is back.
            await self.health.failed(exc, sent_at=sent, deadline=sent)
        finally:
            self._abandon_stale(time.monotonic(), interval)
        await asyncio.sleep(interval)

    async def _refresh_alive_key(self) -> None:
        ttl = self.config.lease * 2 / 3
        sent = time.monotonic()
        await self.client.set(self.queues[0].keys.alive(self._daemon_id), "1", px=max(1, int(ttl * 1000)))
        self.health.ok(sent)
        self._alive_until = sent + ttl  # no later than Redis's own expiry: the SET ran after `sent`

    def _renewed(self, groups: list[list[RunningJob]], replies: list[store.Reply], sent: float) -> None:
        for group, reply in zip(groups, replies, strict=True):
            for running, status in zip(group, store.parse_extend(reply), strict=True):
                if self.running.get((running.keys.queue, running.job.id)) is not running:
                    # The attempt ended while the beat was on the wire and its outcome call decides now. A
                    # LOST here most often only means that its ack got there first: stopping the attempt
                    # would cancel the outcome call and count a lease lost that was not.
                    if status is not ExtendStatus.LOST:
                        running.last_renewed = sent  # the outcome call may retry that much longer
                    continue
                queue_label = self.metrics.queue(running.job.queue)
                if status is ExtendStatus.LOST:
                    log.warning("lease lost; abandoning the attempt", extra={"queue": running.job.queue,
                                "job_id": running.job.id})  # fmt: skip
                    self.metrics.leases_lost.labels(queue_label).inc()
                    self._stop(running, StopReason.LEASE_LOST)
                    continue
                self.metrics.leases_renewed.labels(queue_label).inc()
                running.last_renewed = sent  # the new deadline counts from no earlier than the send
                if status is ExtendStatus.CANCEL_REQUESTED:
                    self._stop(running, StopReason.CANCELED)

    def _abandon_stale(self, now: float, interval: float) -> None:
        for running in list(self.running.values()):
            if running.stop_reason is None and now - running.last_renewed > self.config.lease - interval:
                log.error("lease could not be renewed in time; abandoning the attempt",
                          extra={"queue": running.job.queue, "job_id": running.job.id})  # fmt: skip
                self.metrics.leases_lost.labels(self.metrics.queue(running.job.queue)).inc()
                self._stop(running, StopReason.LEASE_LOST)

    async def _reap(self) -> None:
        """Recover expired leases of every queue (any daemon's), every half lease (at most 15 s), and at
        once when Redis answers again after an outage: leases that expired during it are due now."""
        if not self._reap_failed:
            await self.health.pause(max(0.2, min(self.config.lease / 2, 15.0)))
        calls = [
            store.reap_call(q.keys, default_max_attempts=self.config.defaults.max_attempts, dead=self._dead)
            for q in self.queues
        ]
        sent = time.monotonic()
        try:
            async with self.health.guard():
                replies = await store.execute_async(self.client, calls)
        except REDIS_ERRORS as exc:
            self._reap_failed = True  # the next pass comes after the backoff, not a whole interval later
            await self.health.failed(exc, sent_at=sent)
            return
        self._reap_failed = False
        self.health.ok(sent)
        for queue, reply in zip(self.queues, replies, strict=True):
            for job_id, where in store.parse_reap(reply).items():
                if where in ("pending", "dead"):
                    self.metrics.leases_reaped.labels(self.metrics.queue(queue.keys.queue), where).inc()
                log.warning("recovered an expired lease: job %s", where, extra={"queue": queue.keys.queue,
                            "job_id": job_id})  # fmt: skip
