"""Batched delivery: leased jobs of a handler with `batch` gathered into one executor call (per queue, key
and timeout, up to max_size, for at most max_wait), and each job's own outcome handed back to its attempt.

Every job of a batch keeps its own lease, heartbeat, attempt count and recorded outcome: a batch changes how
many jobs one handler call carries, nothing else (ADR 0015). A job stopped while its batch forms leaves it;
one stopped while its batch's call runs ends with that call, which is itself stopped (the request aborted,
the process killed) once every job in it is stopped: no handler works on a job given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobcar.attempt_desk import LiveAttempt
from jobcar.config_types import BatchDelivery, Handler
from jobcar.executors import BatchExecutor
from jobcar.job import DEFAULT_CONTENT_TYPE, Job
from jobcar.metrics import Metrics
from jobcar.outcome import Outcome

log = logging.getLogger("jobcar.batching")


def batch_key(job: Job, source: str | None) -> str | None:
    """The job's key for grouping (`batch.key`: "key", "meta.<name>" or "payload.<field>"); None without one."""
    if source is None:
        return None
    if source == "key":
        return job.limit_key
    where, name = source.split(".", 1)
    value: object = None
    if where == "meta":
        value = job.meta.get(name)
    elif job.content_type == DEFAULT_CONTENT_TYPE:
        with contextlib.suppress(ValueError):
            document = json.loads(job.payload)
            value = document.get(name) if isinstance(document, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    return value if isinstance(value, str) else None


@dataclass(eq=False, slots=True)
class _Entry:
    """One job's place in a batch."""

    job: Job
    timeout: float
    max_attempts: int
    #: Asked once, when the batch is sent: False when the job must not start now (a drain, an unhealthy
    #: app), having noted why on the attempt.
    may_start: Callable[[], bool]
    #: What the handler may call back for this job (its attempt's URL and token).
    attempt: LiveAttempt
    #: Cancelled once its attempt is stopped (canceled, lease lost, drained): the job then leaves a forming
    #: batch, and a call whose every answer is cancelled is stopped.
    answer: asyncio.Future[Outcome]
    #: Once sent: the call that carries it, and every entry it carries.
    call: asyncio.Task[None] | None = None
    batch: list[_Entry] = field(default_factory=list)


@dataclass(slots=True)
class _Forming:
    entries: list[_Entry]
    timer: asyncio.TimerHandle


class Batches:
    """The forming batches of one batched handler, and its calls. The handler's `concurrency` bounds its
    calls at once (each carries up to max_size jobs)."""

    def __init__(self, handler: Handler, executor: BatchExecutor, metrics: Metrics) -> None:
        assert handler.batch is not None
        self.handler = handler
        self.spec: BatchDelivery = handler.batch
        self.executor = executor
        self._metrics = metrics
        self._forming: dict[tuple[str, str | None, float], _Forming] = {}
        self._calls = asyncio.Semaphore(handler.concurrency) if handler.concurrency else None
        # The calls' tasks, kept until done (the event loop holds tasks only weakly).
        self._tasks: set[asyncio.Task[None]] = set()

    async def outcome(
        self, job: Job, *, timeout_s: float, max_attempts: int, may_start: Callable[[], bool], attempt: LiveAttempt
    ) -> Outcome:
        """Run `job` as part of a batch and return its own outcome. Cancelled: the job leaves its batch, or,
        once its call runs, waits for that call to end (stopping it if no other job in it still runs)."""
        entry = _Entry(job, timeout_s, max_attempts, may_start, attempt, asyncio.get_running_loop().create_future())
        self._add(entry)
        try:
            # Cancelling this await cancels `answer` too: the call then skips it (nothing awaits it any more).
            return await entry.answer
        except asyncio.CancelledError:
            call = entry.call
            if call is not None and not call.done():
                if all(other.answer.cancelled() for other in entry.batch):
                    call.cancel()
                else:
                    log.info("job stopped while its batch's call runs: it ends when the call does",
                             extra={"queue": job.queue, "job_id": job.id, "type": job.type})  # fmt: skip
                await _until_done(call)
            raise

    def send_all(self) -> None:
        """Send every forming batch now (a drain: its jobs are then given back; a reload: the old handler's)."""
        for group in list(self._forming):
            self._send(group)

    def _add(self, entry: _Entry) -> None:
        # A job with a timeout of its own (the producer's) shares a batch only with jobs of the same: a
        # batch's call ends at its shortest, and must not time out the jobs that asked for longer.
        group = (entry.job.queue, batch_key(entry.job, self.spec.key), entry.timeout)
        forming = self._forming.get(group)
        if forming is None:
            timer = asyncio.get_running_loop().call_later(self.spec.max_wait, self._send, group)
            forming = self._forming[group] = _Forming([], timer)
        forming.entries.append(entry)
        if len(forming.entries) >= self.spec.max_size:
            self._send(group)

    def _send(self, group: tuple[str, str | None, float]) -> None:
        forming = self._forming.pop(group, None)
        if forming is None:
            return
        forming.timer.cancel()
        task = asyncio.create_task(self._call(forming.entries), name=f"batch of {self.handler.type}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, entries: list[_Entry]) -> None:
        if self._calls is not None:
            await self._calls.acquire()
        try:
            batch = [entry for entry in entries if not entry.answer.cancelled() and self._starts(entry)]
            if not batch:
                return
            for entry in batch:
                entry.call = asyncio.current_task()
                entry.batch = batch
            self._metrics.batch_sizes.labels(batch[0].job.queue, self.handler.type).observe(len(batch))
            deadline = time.time() + batch[0].timeout  # one timeout per batch: see _add
            jobs = [entry.job for entry in batch]
            try:
                outcomes = await self.executor.run_batch(
                    jobs,
                    deadline=deadline,
                    max_attempts=[entry.max_attempts for entry in batch],
                    attempts=[entry.attempt for entry in batch],
                )
            except Exception as exc:
                log.exception("batch failed inside jobcar", extra={"type": self.handler.type, "jobs": len(batch)})
                outcomes = [Outcome.retry(f"jobcar internal error: {exc!r}")] * len(batch)
            for entry, outcome in zip(batch, outcomes, strict=True):
                if not entry.answer.done():
                    entry.answer.set_result(outcome)
        finally:
            if self._calls is not None:
                self._calls.release()

    @staticmethod
    def _starts(entry: _Entry) -> bool:
        if entry.may_start():
            return True
        entry.answer.cancel()  # its attempt sees CancelledError with the reason noted, and gives the job back
        return False


async def _until_done(task: asyncio.Task[None]) -> None:
    """Wait for `task` to end even when cancelled meanwhile (the caller re-raises its own cancellation)."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
