"""The producer's operations, each written once without I/O: enqueue (with the protocol of jobs that wait
for others), read a job, wait for it, a batch's counters, sealing and waiting for a batch, schedules.

Each is a `transport.Operation`: a generator that yields the Redis work it needs and receives the
replies, run by `Client` (`transport.run_sync`) and `AsyncClient` (`transport.run_async`), which are
thin shells over `Producer`. Only the standard library and redis-py are imported, as for the client.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobcar import schedule_store, tracing
from jobcar.dependencies import (
    EnqueueOrder,
    chained,
    depend_calls,
    enqueue_order,
    ref_of,
    settle_calls,
    silent_dependency_calls,
)
from jobcar.dependency_calls import DependOutcome, SealResult, seal_batch_call, settle_call
from jobcar.enqueueing import EnqueueRecord, enqueue_calls, parse_enqueue
from jobcar.errors import QueueFull, TargetWarning
from jobcar.job import FINISHED, Job, JobInfo
from jobcar.keys import QueueKeys, queues_key, split_job_ref, waiter_ttl_ms
from jobcar.names import ID_PATTERN, check_name
from jobcar.options import EnqueueOptions
from jobcar.records import JobSpec, Payload, build_callbacks, build_record, build_records
from jobcar.replies import BATCH_FIELDS, as_text, decode_names, parse_batch, parse_job
from jobcar.schedules import ScheduleState, make_spec
from jobcar.sentinel import replica_wait_of
from jobcar.targets import KnownTargets
from jobcar.transitions import cancel_call
from jobcar.transport import AsyncRedis, Operation, ReplicaWait, Sleep, SyncRedis, raise_first_error, run_calls

if TYPE_CHECKING:
    from jobcar.tracing_otel import ProducerTracer


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """The counters of a batch (jobs enqueued with `batch=<id>`), read from `<ns>:{<queue>}:batch:<id>`.

    `total` counts each job once, when it is stored: an enqueue that finds its id (status EXISTS) or its
    unique key (DUPLICATE) writes nothing and counts nothing. A requeued dead job leaves `dead` again.
    A batch nobody enqueued into, or whose hash expired (7 days after its last change), reads as zeros.
    """

    batch_id: str
    queue: str
    total: int = 0
    done: int = 0
    dead: int = 0
    canceled: int = 0

    @property
    def pending(self) -> int:
        """Jobs of the batch that have not ended yet (pending, scheduled or active)."""
        return self.total - self.done - self.dead - self.canceled

    @property
    def finished(self) -> bool:
        """Every job stored so far has ended: done, dead or canceled."""
        return self.pending <= 0

    def __str__(self) -> str:
        return (
            f"batch {self.batch_id!r} in queue {self.queue!r}: total={self.total} done={self.done} "
            f"dead={self.dead} canceled={self.canceled} pending={self.pending}"
        )


@dataclass(frozen=True, slots=True)
class BatchSeal:
    """What `seal_batch` did: the batch's callbacks as enqueued, and whether they wait (SEALED), were told
    at once (COMPLETE: every job had ended), or were canceled because the batch had fired before (FIRED)."""

    batch_id: str
    queue: str
    result: SealResult
    callbacks: list[JobInfo]


class _Deadline:
    """The polling of `wait` and `wait_batch`: how long to sleep before the next look, or TimeoutError."""

    def __init__(self, timeout: float, poll: float) -> None:
        if not (math.isfinite(timeout) and timeout >= 0):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        if not (math.isfinite(poll) and poll > 0):
            raise ValueError(f"poll must be a positive number of seconds, got {poll!r}")
        self.timeout, self.poll = timeout, poll
        self.end = time.monotonic() + timeout

    def next_sleep(self, what: object) -> Sleep:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} still unfinished after {self.timeout:g} s")
        return Sleep(min(self.poll, left))


class Producer:
    """What Client and AsyncClient do, without I/O: each method an operation for them to run."""

    def __init__(
        self,
        client: SyncRedis | AsyncRedis,
        namespace: str,
        max_payload_bytes: int,
        targets: KnownTargets | None = None,
    ) -> None:
        pool = getattr(client, "connection_pool", None)
        encoder = pool.get_encoder() if pool is not None else client.get_encoder()
        if encoder.decode_responses:
            raise ValueError("jobcar needs a redis client created with decode_responses=False (payloads are bytes)")
        self.namespace = check_name("namespace", namespace)
        self.max_payload_bytes = max_payload_bytes
        #: On Sentinel, an enqueue is acknowledged once replicas hold it (docs/delivery-semantics.md).
        self.replica_wait: ReplicaWait | None = replica_wait_of(client)
        #: The queues this producer added to `<ns>:queues` already.
        self._registered: set[str] = set()
        #: What the config it was made from runs (`Client.from_config`), to say when a job's type or queue is not.
        self.targets = targets

    # -- enqueue ----------------------------------------------------------------------------------

    def enqueue_one(self, type: str, payload: Payload, options: EnqueueOptions) -> Operation[JobInfo]:
        return (yield from self.enqueue([build_record(type, payload, self.max_payload_bytes, **options)]))[0]

    def enqueue_many(self, jobs: Iterable[JobSpec]) -> Operation[list[JobInfo]]:
        return self.enqueue(build_records(jobs, self.max_payload_bytes))

    def chain(self, steps: Iterable[JobSpec]) -> Operation[list[JobInfo]]:
        return self.enqueue(chained(build_records(steps, self.max_payload_bytes)))

    def enqueue(self, records: list[EnqueueRecord]) -> Operation[list[JobInfo]]:
        """Store the records; results in their order. Jobs that wait for others of the same call (ADR 0016)
        make it a staged enqueue (`dependencies.enqueue_order`)."""
        if self.targets is not None:
            self._check_targets(records)
        tracer = tracing.for_producer()
        if tracer is None and not any(r.after for r in records):
            return self.store(records)  # the usual call, kept one operation shorter: the hot path
        order = enqueue_order(records)
        if tracer is not None:
            return self._traced(tracer, records, order)
        return self._staged(records, order)  # a job waits for another: stored in stages, or registered after

    def _traced(
        self, tracer: ProducerTracer, records: list[EnqueueRecord], order: EnqueueOrder
    ) -> Operation[list[JobInfo]]:
        """The enqueue inside its producer span, started when the operation runs (in the caller's context): each
        job that brings no traceparent carries the span's (tracing_otel.Tracer.send)."""
        span = tracer.send(records)
        operation = self.store(records) if not order.later and len(order.stages) == 1 else self._staged(records, order)
        if span is None:
            return (yield from operation)
        try:
            infos = yield from operation
            # A batch keeps the context of its first jobs beside its counters: its callbacks' spans link to it. Only
            # for jobs this call stored, whose script just wrote the counters (the hash exists, with its expiry).
            batches = {(r.queue, r.batch): r.traceparent for r, info in zip(reversed(records), reversed(infos),
                       strict=True) if r.batch and r.traceparent and info.created}  # fmt: skip
            if batches:
                yield [("HSETNX", QueueKeys.of(self.namespace, queue).batch(batch), "traceparent", traceparent)
                       for (queue, batch), traceparent in batches.items()]  # fmt: skip
        except BaseException as exc:
            tracer.send_failed(span, exc)
            raise
        tracer.sent(span, infos)
        return infos

    def _check_targets(self, records: list[EnqueueRecord]) -> None:
        assert self.targets is not None
        problems = self.targets.check((r.type, r.queue) for r in records)
        if problems:
            warnings.warn("; ".join(problems), TargetWarning, stacklevel=2)

    def _staged(self, records: list[EnqueueRecord], order: EnqueueOrder) -> Operation[list[JobInfo]]:
        """Store each stage after the one before, then register the waiting jobs with their dependencies
        enqueued earlier, and tell at once those whose dependency never will (it had ended, or was not
        stored)."""
        infos = {}
        for stage in order.stages:
            try:
                stored = yield from self.store(stage)
            except QueueFull as full:
                yield from self._refused_stage(stage, full)
                raise
            infos.update({ref_of(r): info for r, info in zip(stage, stored, strict=True)})
        registering = depend_calls(self.namespace, order.later, infos)
        replies = (yield from run_calls([c for _, c in registering])) if registering else []
        outcomes = [DependOutcome(as_text(reply)) for reply in replies]
        tellings = settle_calls(self.namespace, [pair for pair, _ in registering], outcomes)
        tellings += silent_dependency_calls(self.namespace, (r for stage in order.stages for r in stage), infos)
        if tellings:
            yield from run_calls(tellings, wait=self.replica_wait)
        return [infos[ref_of(r)] for r in records]

    def _refused_stage(self, stage: list[EnqueueRecord], full: QueueFull) -> Operation[None]:
        """Backpressure refused (part of) a stage: the jobs stored in earlier stages that wait for its refused
        jobs are told now that those are gone, as for a dependency never stored (ADR 0024)."""
        stored = {(info.queue, info.id) for info in full.stored}
        tellings = [settle_call(QueueKeys.of(self.namespace, queue), job_id, [ref_of(r)], DependOutcome.GONE.value)
                    for r in stage if (r.queue, r.id) not in stored
                    for queue, job_id in (split_job_ref(ref) for ref in r.dependents)]  # fmt: skip
        if tellings:
            yield from run_calls(tellings, wait=self.replica_wait)

    def store(self, records: list[EnqueueRecord]) -> Operation[list[JobInfo]]:
        """Store records (checked and encoded by `records`), their queues added to `<ns>:queues` first
        (outside the scripts: that key is in another slot)."""
        if not records:
            return []
        queues = {r.queue for r in records}
        if not queues <= self._registered:
            for queue in sorted(queues - self._registered):
                yield ("SADD", queues_key(self.namespace), queue)
                self._registered.add(queue)
        calls = enqueue_calls(self.namespace, records)
        # Error replies come back as replies: a call refused by backpressure raises QueueFull after the others'
        # jobs are read (parse_enqueue), any other is raised as run_calls would.
        replies = yield from run_calls(calls, raise_on_error=False, wait=self.replica_wait)
        return parse_enqueue(records, replies)

    # -- jobs and batches -------------------------------------------------------------------------

    def get(self, job_id: str, queue: str | None) -> Operation[Job | None]:
        """The job from the first queue (in name order, or only `queue`) that holds a hash for it."""
        queues = [queue] if queue else decode_names((yield ("SMEMBERS", queues_key(self.namespace))))
        hashes = yield [("HGETALL", QueueKeys.of(self.namespace, q).job(job_id)) for q in queues]
        raise_first_error(hashes)
        for q, fields in zip(queues, hashes, strict=True):
            if fields:
                return parse_job(job_id, q, fields)
        return None

    def wait(self, job_id: str, timeout: float, queue: str | None, poll: float) -> Operation[Job | None]:
        deadline = _Deadline(timeout, poll)
        marked = False
        while True:
            if queue is not None and not marked:
                # Marked before the look that may find it running: its ack then keeps it for this wait, even
                # without a kept result (ack.lua). An unknown queue is marked once a look has found it.
                yield ("SET", QueueKeys.of(self.namespace, queue).waiter(job_id), "1", "PX", waiter_ttl_ms(timeout))
                marked = True
            job = yield from self.get(job_id, queue)
            if job is None or job.state in FINISHED:
                return job
            if queue is None:
                queue = job.queue  # found: later looks read that queue only, and it is marked before the next
                continue
            yield deadline.next_sleep(f"job {job_id} in queue {job.queue} ({job.state.value})")

    def batch_status(self, batch_id: str, queue: str) -> Operation[BatchStatus]:
        check_name("batch id", batch_id, ID_PATTERN)
        key = QueueKeys.of(self.namespace, check_name("queue name", queue)).batch(batch_id)
        total, done, dead, canceled = parse_batch((yield ("HMGET", key, *BATCH_FIELDS)))
        return BatchStatus(batch_id, queue, total, done, dead, canceled)

    def seal_batch(
        self, batch_id: str, queue: str, on_complete: JobSpec | None, on_success: JobSpec | None
    ) -> Operation[BatchSeal]:
        callbacks = build_callbacks(batch_id, queue, {"on_complete": on_complete, "on_success": on_success},
                                    self.max_payload_bytes)  # fmt: skip
        infos = yield from self.store(callbacks)
        seal = seal_batch_call(QueueKeys.of(self.namespace, queue), batch_id, [ref_of(r) for r in callbacks])
        (reply,) = yield from run_calls([seal])
        result = SealResult(as_text(reply))
        if result is SealResult.FIRED:  # a batch that fired before tells no callback again: cancel the new ones
            cancels = [cancel_call(QueueKeys.of(self.namespace, i.queue), i.id) for i in infos if i.created]
            if cancels:
                yield from run_calls(cancels)
        return BatchSeal(batch_id, queue, result, infos)

    def wait_batch(self, batch_id: str, timeout: float, queue: str, poll: float) -> Operation[BatchStatus]:
        deadline = _Deadline(timeout, poll)
        while True:
            status = yield from self.batch_status(batch_id, queue)
            if status.finished:
                return status
            yield deadline.next_sleep(status)

    # -- schedules (docs/schedules.md): kept in Redis, fired by the daemons serving their queue --------

    def upsert_schedule(self, name: str, spec: dict[str, Any]) -> Operation[str]:
        built = make_spec(name, max_payload_bytes=self.max_payload_bytes, **spec)
        return schedule_store.upsert(self.namespace, built, "api")

    def schedule(self, name: str) -> Operation[ScheduleState | None]:
        return schedule_store.get(self.namespace, name)

    def schedules(self) -> Operation[list[ScheduleState]]:
        return schedule_store.every_schedule(self.namespace)

    def change_schedule(self, name: str, action: str) -> Operation[int]:
        if action not in ("pause", "resume", "remove"):
            raise ValueError(f"a schedule can be paused, resumed or removed, not {action!r}")
        return schedule_store.change(self.namespace, name, action)

    def trigger_schedule(self, name: str) -> Operation[str | None]:
        return schedule_store.trigger(self.namespace, name, self.max_payload_bytes)
