"""The jobs this daemon runs: one task per leased job, from its type's concurrency slot through its
executor (or its handler's batch, `batching`) to its recorded outcome.

An attempt knows Outcomes, not HTTP or processes (those are the executors'). It ends in one of two
ways: its executor's Outcome is recorded (`recording`), or it is stopped early (`StopReason`: a cancel,
a lost lease, a drain, an unhealthy app) and records that instead. While Redis is away or refusing,
recording is retried until the lease would have expired: after that the job belongs to whoever reaps
it (at-least-once).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from jobcar import tracing
from jobcar.app_health import HealthGate
from jobcar.attempt_desk import CANCELED, LEASE_LOST, STOPPED, AttemptDesk, LiveAttempt
from jobcar.attempt_lines import log, log_fields, log_finished, log_finished_enabled
from jobcar.attempt_logs import LogWriter
from jobcar.batching import Batches
from jobcar.config_types import CommandHandler, Config, Handler
from jobcar.dependencies import BATCH_REF_PREFIX
from jobcar.executors import BatchExecutor, Executor
from jobcar.history import History
from jobcar.job import Job, State
from jobcar.keys import QueueKeys
from jobcar.metrics import Metrics
from jobcar.outcome import Outcome
from jobcar.recording import OutcomeCall, Recorded, outcome_call
from jobcar.redis_link import REDIS_ERRORS, RedisLink
from jobcar.transitions import LeasedJob

if TYPE_CHECKING:
    from jobcar.tracing_otel import Tracer
    from jobcar.tracing_spans import Span

#: At most this many of a job's dependencies are read for their traceparents (its span's links).
MAX_DEPENDENCY_LINKS: Final = 32


class StopReason(StrEnum):
    CANCELED = "canceled by an operator"
    LEASE_LOST = "lease lost"
    SHUTDOWN = "returned to pending: the daemon is shutting down"
    APP_UNHEALTHY = "returned to pending: the app is unhealthy"


#: Why a handler's calls after its attempt stopped early are refused (attempt_desk.py).
_STOPPED_BECAUSE: Final[dict[StopReason | None, str]] = {
    StopReason.CANCELED: CANCELED,
    StopReason.LEASE_LOST: LEASE_LOST,
    StopReason.SHUTDOWN: STOPPED,
    StopReason.APP_UNHEALTHY: STOPPED,
}


class RunningJob(LiveAttempt):
    """An attempt leased here, from its lease until its outcome is recorded; its handler calls it back as the
    LiveAttempt it is (attempt_desk.py)."""

    __slots__ = ("last_renewed", "span", "stop_reason", "task")

    def __init__(self, leased: LeasedJob, keys: QueueKeys) -> None:
        super().__init__(leased, keys)
        self.last_renewed = time.monotonic()
        self.stop_reason: StopReason | None = None
        self.task: asyncio.Task[None] | None = None
        #: Its consumer span while tracing is on (tracing.py), until its outcome is recorded.
        self.span: Span | None = None


class Attempts:
    """Starts, stops and settles the attempts of leased jobs, and records how each ended.

    `slot_freed` is set whenever an attempt stops running here (its slot is free for a new lease);
    `draining` is set once the daemon stops leasing: no handler starts after it.
    """

    def __init__(
        self,
        link: RedisLink,
        metrics: Metrics,
        history: History,
        app_health: HealthGate,
        slot_freed: asyncio.Event,
        draining: asyncio.Event,
        desk: AttemptDesk,
    ) -> None:
        self.link = link
        self.desk = desk
        desk.answer_now = self._answer_now
        self.metrics = metrics
        self.history = history
        self.app_health = app_health
        self.slot_freed = slot_freed
        self.draining = draining
        #: (queue, job id) -> the attempt still executing here (where the desk finds its handler's calls).
        self.running: dict[tuple[str, str], RunningJob] = {}
        desk.running = self.running
        # Every attempt's task until it has recorded its outcome (running only holds those still executing).
        self.tasks: set[asyncio.Task[None]] = set()
        self.returned_on_shutdown = 0
        #: For the drain's log: the attempts in flight when it began, and those leased after (collected from
        #: the lease that was waiting when it began), which go back without running.
        self.in_flight_at_drain = 0
        self.leased_while_draining = 0
        #: Told the queue of an acked job that others wait for (the runner's settler carries it to them).
        self.on_dependents: Callable[[str], None] = lambda queue: None
        self._type_slots: dict[str, tuple[int, asyncio.Semaphore]] = {}
        self._batches: dict[str, Batches] = {}
        self.tracer = tracing.active  # None while tracing is off: each use below is one test

    def apply(self, config: Config, executors: Mapping[str, Executor]) -> None:
        """Take a (re)loaded config's handlers. Running jobs finish with the executor they started with."""
        self.config = config
        self.desk.config = config
        self.logs = LogWriter(self.link.client, config.handler_api)
        self.handlers: Mapping[str, Handler] = config.handlers
        #: The types whose command's stderr lines go to the job's log (`log_stderr`).
        self._stderr_logged = frozenset(
            job_type for job_type, handler in config.handlers.items()
            if isinstance(handler, CommandHandler) and handler.log_stderr
        )  # fmt: skip
        self.executors = dict(executors)
        slots: dict[str, tuple[int, asyncio.Semaphore]] = {}
        batches: dict[str, Batches] = {}
        for job_type, handler in config.handlers.items():
            executor = self.executors.get(job_type)
            if handler.batch is not None and isinstance(executor, BatchExecutor):
                # A batched handler's concurrency counts its calls, each of up to max_size jobs (Batches).
                kept_batches = self._batches.pop(job_type, None)
                if kept_batches is not None and kept_batches.handler == handler:
                    kept_batches.executor = executor  # every reload builds new executors, on the same clients
                else:
                    if kept_batches is not None:
                        kept_batches.send_all()  # what the old handler's batches hold goes with it
                    kept_batches = Batches(handler, executor, self.metrics)
                batches[job_type] = kept_batches
            elif handler.concurrency is not None:
                kept = self._type_slots.get(job_type)
                if kept is None or kept[0] != handler.concurrency:  # a reload may change the limit
                    kept = (handler.concurrency, asyncio.Semaphore(handler.concurrency))
                slots[job_type] = kept
        self._type_slots = slots
        for removed in self._batches.values():  # a type no longer batched (or no longer handled)
            removed.send_all()
        self._batches = batches

    # -- starting and stopping --------------------------------------------------------------------

    def start(self, keys: QueueKeys, leased: LeasedJob) -> None:
        key = (keys.queue, leased.job.id)
        if self.draining.is_set():
            self.leased_while_draining += 1
        earlier = self.running.get(key)
        if earlier is not None and earlier.answered:
            # Its handler answered through the handler API (a snooze, waiting for its children) and is still
            # finishing: it holds no lease and records nothing, so it ends on its own, as its handler does.
            log.debug("job leased again while the handler that answered its earlier attempt still runs",
                      extra={"queue": keys.queue, "job_id": leased.job.id})  # fmt: skip
        elif earlier is not None:
            # Our own earlier attempt lost its lease (reaped while we could not renew it) and the job
            # came back to us: that attempt must stop before this one runs.
            log.warning("job leased again while an earlier attempt runs; stopping that attempt",
                        extra={"queue": keys.queue, "job_id": leased.job.id})  # fmt: skip
            self.stop(earlier, StopReason.LEASE_LOST)
        running = RunningJob(leased, keys)
        self.running[key] = running
        self.metrics.of_queue(keys.queue).in_flight.inc()
        running.task = asyncio.create_task(self._run(running), name=f"job {leased.job.id}")
        self.tasks.add(running.task)
        running.task.add_done_callback(self.tasks.discard)

    def stop(self, running: RunningJob, reason: StopReason) -> None:
        if running.stop_reason is None and running.task is not None:
            self._note_stop(running, reason)
            running.task.cancel()

    def stop_all(self, reason: StopReason) -> None:
        for running in list(self.running.values()):
            self.stop(running, reason)

    async def settle(self, grace: float) -> None:
        """At a drain: let attempts finish for up to `grace` seconds, stop the rest, and wait until every one
        has given its job back or recorded its outcome."""
        started = time.monotonic()
        for batches in self._batches.values():
            batches.send_all()  # no handler starts now: what they hold goes back at once
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=grace)
        self.stop_all(StopReason.SHUTDOWN)
        if self.tasks:
            # Executors stop handlers (TERM, grace, KILL) before their task ends; each task then gives
            # its job back, or gives up once its lease would have expired.
            await asyncio.wait(set(self.tasks))
        # Every job the drain saw either ended (done, retried, dead, lost) or went back to pending.
        seen = self.in_flight_at_drain + self.leased_while_draining
        log.info("drained in %.1f s: %d jobs in flight and %d leased as the drain began; %d ended, %d returned to "
                 "pending", time.monotonic() - started, self.in_flight_at_drain, self.leased_while_draining,
                 seen - self.returned_on_shutdown, self.returned_on_shutdown)  # fmt: skip

    def _check_may_start(self, running: RunningJob) -> None:
        """Never start a handler after the drain began, nor while the app is unhealthy (a lease queued behind
        an idle wait takes jobs whenever they come, ADR 0005): the job goes back, its attempt returned, as
        if stopped. (Not `stop`: cancelling its own task would also cancel the give-back call it makes.)"""
        if not self._may_start(running):
            raise asyncio.CancelledError

    def _may_start(self, running: RunningJob) -> bool:
        """False, with the reason noted on the attempt, when its handler must not start now."""
        if running.stop_reason is not None:
            return False  # stopped already (canceled, lease lost): that reason stands
        if self.draining.is_set():
            reason = StopReason.SHUTDOWN
        elif not self.app_health.healthy(self.config.health_url):
            reason = StopReason.APP_UNHEALTHY
        else:
            return True
        self._note_stop(running, reason)
        return False

    def _note_stop(self, running: RunningJob, reason: StopReason) -> None:
        """Say why the attempt ends early: its task then records that instead of an outcome."""
        running.stop_reason = reason
        if running.token:  # its handler may still call while it is stopped: refused from now on
            self.desk.stop(running, _STOPPED_BECAUSE[reason])
        if reason is StopReason.SHUTDOWN:
            self.returned_on_shutdown += 1

    def _forget(self, running: RunningJob) -> None:
        """The attempt no longer runs here (called once per attempt); its outcome may still be recorded."""
        key = (running.keys.queue, running.job.id)
        if self.running.get(key) is running:
            del self.running[key]
        self.metrics.of_queue(running.keys.queue).in_flight.dec()
        self.slot_freed.set()

    # -- one attempt ------------------------------------------------------------------------------

    async def _run(self, running: RunningJob) -> None:
        job = running.job
        if self.tracer is not None:
            running.span = self.tracer.attempt(job)
        if job.cancel_requested:
            # Canceled while an earlier attempt ran, which then failed or lost its daemon.
            self._forget(running)
            await self._record(running, Outcome.success(), final=State.CANCELED)
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
                await self._record(running, Outcome.success(), final=State.CANCELED)
            elif reason in (StopReason.SHUTDOWN, StopReason.APP_UNHEALTHY):
                await self._record(running, Outcome.retry(reason.value, after=0, spend_attempt=False), give_back=True)
            return
        except Exception as exc:
            log.exception("job failed inside jobcar", extra=log_fields(job))
            outcome = Outcome.retry(f"jobcar internal error: {exc!r}")
        self._forget(running)
        if running.answered:
            # Its handler answered through the handler API (a snooze, waiting for its children), which
            # recorded that: what the handler then returned changes nothing.
            log.debug("job answered through the handler API; its handler's own answer is not used",
                      extra=log_fields(job))  # fmt: skip
            return
        elapsed = time.monotonic() - started
        if self.tracer is None or running.span is None:
            self.metrics.of_job(job.queue, job.type).duration.observe(elapsed)
        else:  # the attempt's trace as the observation's exemplar (OpenMetrics)
            self.metrics.of_job(job.queue, job.type).duration.observe(elapsed, self.tracer.exemplar(running.span))
        recorded = await self._record(running, outcome)
        if recorded is not None and log_finished_enabled(recorded[0]):
            log_finished(job, outcome, recorded[0], recorded[1], elapsed, job.max_attempts or self._max_attempts(job))

    def _max_attempts(self, job: Job) -> int:
        handler = self.handlers.get(job.type)
        return handler.max_attempts if handler is not None else self.config.defaults.max_attempts

    async def _execute(self, running: RunningJob) -> Outcome:
        job = running.job
        self._check_may_start(running)
        if self.tracer is not None and running.span is not None and job.after:
            await self._link_dependencies(self.tracer, running.span, running.keys.namespace, job.after)
        handler = self.handlers.get(job.type)
        executor = self.executors.get(job.type)
        if handler is None or executor is None:
            return Outcome.fail(f"no handler for type {job.type}")
        timeout = job.timeout_ms / 1000 if job.timeout_ms else handler.timeout
        max_attempts = job.max_attempts or handler.max_attempts
        batches = self._batches.get(job.type)
        if batches is not None:
            # Asked again when the batch is sent: the drain may have begun while it formed. A batch's time is
            # its call's, shared by its jobs: none of them can extend it.
            may_start = functools.partial(self._may_start, running)
            self._open(running, timeout, 0.0)
            return await batches.outcome(job, timeout_s=timeout, max_attempts=max_attempts, may_start=may_start,
                                         attempt=running)  # fmt: skip
        limit = self._type_slots.get(job.type)
        if limit is None and (self.tracer is None or running.span is None):
            # The common path calls the executor itself: a coroutine between them would be paid again every time
            # the handler's answer resumes the attempt.
            deadline = self._open(running, timeout, handler.max_extend)
            return await executor.run(job, deadline=deadline, max_attempts=max_attempts, attempt=running)
        if limit is None:
            return await self._call_handler(running, executor, timeout, handler.max_extend, max_attempts)
        # A job of a type at its concurrency limit waits here, holding one of the daemon's slots.
        if self.tracer is not None and running.span is not None and limit[1].locked():
            self.tracer.held_here(running.span, limit[0])
        async with limit[1]:
            self._check_may_start(running)
            return await self._call_handler(running, executor, timeout, handler.max_extend, max_attempts)

    async def _call_handler(
        self, running: RunningJob, executor: Executor, seconds: float, max_extend: float, max_attempts: int
    ) -> Outcome:
        deadline = self._open(running, seconds, max_extend)
        if self.tracer is None or running.span is None:
            return await executor.run(running.job, deadline=deadline, max_attempts=max_attempts, attempt=running)
        # The handler continues the trace under its call's client span (its traceparent goes out).
        handler = self.handlers[running.job.type]
        call, running.traceparent = self.tracer.handler_call(running.span, running.job, handler)
        try:
            outcome = await executor.run(running.job, deadline=deadline, max_attempts=max_attempts, attempt=running)
        except BaseException as exc:
            self.tracer.handler_stopped(call, exc)
            raise
        self.tracer.handler_returned(call, outcome)
        return outcome

    async def _link_dependencies(self, tracer: Tracer, span: Span, namespace: str, after: tuple[str, ...]) -> None:
        """Link the attempt's span to the jobs it waited for: their traceparents, one HGET each at once, from
        the hashes that still exist (a job acked without result_ttl is gone); a batch's callback to its batch,
        whose counters keep its first jobs' traceparent (producer.py). Nothing read fails the attempt."""
        keys = []
        for ref in after[:MAX_DEPENDENCY_LINKS]:
            queue, _, ref_id = ref.partition("/")  # "<queue>/<id>": no "/" in a queue name
            queue_keys = QueueKeys.of(namespace, queue)
            batch = ref_id.removeprefix(BATCH_REF_PREFIX)
            keys.append(queue_keys.batch(batch) if batch != ref_id else queue_keys.job(ref_id))
        reads = (self.link.client.hget(key, "traceparent") for key in keys)
        replies = await asyncio.gather(*reads, return_exceptions=True)
        tracer.link(span, [reply.decode() for reply in replies if isinstance(reply, bytes)])

    def _open(self, running: RunningJob, seconds: float, max_extend: float) -> float:
        """Make the attempt callable by its handler (attempt_desk.py) until it leaves `running` or is stopped, with
        `seconds` to run from now; its deadline. On every job's path: it only sets the attempt's own fields, so a
        handler that never calls back costs next to nothing."""
        deadline = time.time() + seconds
        self.desk.open(running, deadline, deadline + max_extend)
        if running.job.type in self._stderr_logged:
            running.stderr_lines = self.logs.forward(running)
        return deadline

    async def _answer_now(self, live: LiveAttempt, outcome: Outcome) -> bool:
        """Record the outcome its handler gave through the handler API (the desk's `answer_now`)."""
        if not isinstance(live, RunningJob):
            return False
        recorded = await self._record(live, outcome)
        return recorded is not None and recorded[0] is not Recorded.LEASE_LOST

    async def _record(
        self, running: RunningJob, outcome: Outcome, final: State = State.DONE, give_back: bool = False
    ) -> tuple[Recorded, OutcomeCall] | None:
        """Record the outcome, retrying while Redis is away until the lease would have expired (then None)."""
        job = running.job
        recording = outcome_call(self.config, running.keys, running.leased, outcome, final=final, give_back=give_back)
        while True:
            sent = time.monotonic()
            try:
                # The batcher's future itself, not RedisLink.call: a coroutine layer per finished job is a
                # measurable share of the daemon's CPU (ADR 0006). The batcher guards each round trip and
                # reports Redis's answers; a failure is paced here, by the link's own rule.
                reply = await self.link.batcher.call(recording.call)
                break
            except REDIS_ERRORS as exc:
                expires = running.last_renewed + self.config.lease
                if time.monotonic() > expires:
                    log.error("could not record the outcome before the lease expired: %s", exc, extra=log_fields(job))
                    if self.tracer is not None and running.span is not None:
                        self.tracer.unrecorded(running.span, f"outcome not recorded before the lease expired: {exc}")
                        running.span = None
                    return None
                # Never back off past the lease: once it expires the job is reaped and runs again, even
                # if Redis was back a moment after the outcome failed.
                await self.link.reachability.failed(exc, sent_at=sent, deadline=expires)
        recorded = recording.recorded(reply)
        if self.tracer is not None and running.span is not None:
            self.tracer.recorded(running.span, recorded, outcome, recording.retry_in)
            running.span = None  # an attempt's outcome is recorded once: a later call ends nothing
        if recording.tells_dependents(reply):
            self.on_dependents(job.queue)
        self.metrics.of_job(job.queue, job.type).finished[recorded].inc()  # a StrEnum: its own key
        self.history.add(job.queue, job.type, recorded)
        if recorded is Recorded.LEASE_LOST:
            why = "lease lost before the outcome was recorded; another daemon owns the job"
            log.warning(why, extra=log_fields(job))
        return recorded, recording
