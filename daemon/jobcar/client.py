"""The producer client: enqueue jobs from any Python process, including a Spark executor.

    from jobcar import Client
    jobs = Client.from_url("redis://127.0.0.1:6379/0")
    info = jobs.enqueue("email.welcome", {"user": 42}, queue="critical")

`Client` and `AsyncClient` are two thin I/O shells over one core (`_Producer`), which checks and encodes
jobs (`records`), builds the calls to send and reads the replies; the shells only send, synchronously
or awaited. Only the standard library and redis-py are imported, so `from jobcar import Client` works
on a machine (or in a zip shipped with `addPyFile`) that has nothing else.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Unpack

import redis
import redis.asyncio

from jobcar import schedule_store
from jobcar.dependencies import (
    EnqueueOrder,
    chained,
    depend_calls,
    enqueue_order,
    ref_of,
    settle_calls,
    silent_dependency_calls,
)
from jobcar.dependency_calls import DependOutcome, SealResult, seal_batch_call
from jobcar.enqueueing import EnqueueRecord, enqueue_calls, parse_enqueue
from jobcar.job import FINISHED, Job, JobInfo
from jobcar.keys import DEFAULT_NAMESPACE, DEFAULT_QUEUE, QueueKeys, queues_key
from jobcar.names import ID_PATTERN, check_name
from jobcar.options import EnqueueOptions
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES, JobSpec, Payload, build_callbacks, build_record, build_records
from jobcar.redis_url import EMBEDDED_URL, is_sentinel_url
from jobcar.replies import BATCH_FIELDS, as_text, decode_names, parse_batch, parse_job
from jobcar.schedule_store import run_async, run_sync
from jobcar.schedules import ScheduleState, make_spec
from jobcar.scripts import Reply, ScriptCall
from jobcar.sentinel import async_sentinel_client, replica_wait_of, sentinel_client
from jobcar.transitions import cancel_call
from jobcar.transport import AsyncRedis, ReplicaWait, SyncRedis, execute, execute_async


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


@dataclass(frozen=True, slots=True)
class _EnqueuePlan:
    records: list[EnqueueRecord]
    #: Queues to add to `<ns>:queues` first (outside the scripts: that key is in another slot).
    register: list[str]
    calls: list[ScriptCall]


class _Deadline:
    """The polling of `wait` and `wait_batch`: how long to sleep before the next look, or TimeoutError."""

    def __init__(self, timeout: float, poll: float) -> None:
        if not (math.isfinite(timeout) and timeout >= 0):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        if not (math.isfinite(poll) and poll > 0):
            raise ValueError(f"poll must be a positive number of seconds, got {poll!r}")
        self.timeout, self.poll = timeout, poll
        self.end = time.monotonic() + timeout

    def next_sleep(self, what: object) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} still unfinished after {self.timeout:g} s")
        return min(self.poll, left)


class _Producer:
    """What Client and AsyncClient share, without I/O: checking jobs, the calls to send, reading replies."""

    def __init__(self, client: SyncRedis | AsyncRedis, namespace: str, max_payload_bytes: int) -> None:
        pool = getattr(client, "connection_pool", None)
        encoder = pool.get_encoder() if pool is not None else client.get_encoder()
        if encoder.decode_responses:
            raise ValueError("jobcar needs a redis client created with decode_responses=False (payloads are bytes)")
        self.namespace = check_name("namespace", namespace)
        self.max_payload_bytes = max_payload_bytes
        #: On Sentinel, an enqueue is acknowledged once replicas hold it (docs/delivery-semantics.md).
        self.replica_wait: ReplicaWait | None = replica_wait_of(client)
        self._registered: set[str] = set()

    def enqueue_plan(self, records: list[EnqueueRecord]) -> _EnqueuePlan:
        """The calls that store these records (checked and encoded by `records`, before anything is sent)."""
        register = sorted({r.queue for r in records} - self._registered)
        return _EnqueuePlan(records, register, enqueue_calls(self.namespace, records))

    def registered(self, queue: str) -> None:
        self._registered.add(queue)

    def job_keys(self, job_id: str, queues: Sequence[str]) -> list[str]:
        return [QueueKeys.of(self.namespace, queue).job(job_id) for queue in queues]

    # -- jobs that wait for others (ADR 0016): what to send once a call's stages are stored ----------

    def registrations(
        self, order: EnqueueOrder, infos: dict[str, JobInfo]
    ) -> list[tuple[tuple[EnqueueRecord, str], ScriptCall]]:
        """The `depend` calls registering the stored waiting jobs with their dependencies enqueued earlier."""
        return depend_calls(self.namespace, order.later, infos)

    def tellings(
        self,
        order: EnqueueOrder,
        registering: Sequence[tuple[tuple[EnqueueRecord, str], ScriptCall]],
        replies: Sequence[Reply],
        infos: dict[str, JobInfo],
    ) -> list[ScriptCall]:
        """The `settle` calls for the waiting jobs whose dependencies will never tell them: those `depend`
        found ended, and those of this call that had ended or were not stored."""
        outcomes = [DependOutcome(as_text(reply)) for reply in replies]
        calls = settle_calls(self.namespace, [pair for pair, _ in registering], outcomes)
        return calls + silent_dependency_calls(self.namespace, (r for stage in order.stages for r in stage), infos)

    def callbacks(
        self, batch_id: str, queue: str, on_complete: JobSpec | None, on_success: JobSpec | None
    ) -> list[EnqueueRecord]:
        return build_callbacks(batch_id, queue, {"on_complete": on_complete, "on_success": on_success},
                               self.max_payload_bytes)  # fmt: skip

    def seal_call(self, batch_id: str, queue: str, callbacks: Sequence[EnqueueRecord]) -> ScriptCall:
        return seal_batch_call(QueueKeys.of(self.namespace, queue), batch_id, [ref_of(r) for r in callbacks])

    def sealed(
        self, batch_id: str, queue: str, reply: Reply, infos: list[JobInfo]
    ) -> tuple[BatchSeal, list[ScriptCall]]:
        """What the seal did, and the cancels to send: a batch that had fired before tells no callback again,
        so the callbacks this seal created are canceled."""
        result = SealResult(as_text(reply))
        created = [i for i in infos if i.created] if result is SealResult.FIRED else []
        cancels = [cancel_call(QueueKeys.of(self.namespace, i.queue), i.id) for i in created]
        return BatchSeal(batch_id, queue, result, infos), cancels

    def batch_key(self, batch_id: str, queue: str) -> str:
        check_name("batch id", batch_id, ID_PATTERN)
        return QueueKeys.of(self.namespace, check_name("queue name", queue)).batch(batch_id)


def _schedule_action(action: str) -> str:
    if action not in ("pause", "resume", "remove"):
        raise ValueError(f"a schedule can be paused, resumed or removed, not {action!r}")
    return action


def _check_not_both(url: str, cluster: bool) -> None:
    if cluster and is_sentinel_url(url):
        raise ValueError("a Redis Cluster is not found through Sentinel: give cluster=True a node's redis:// URL")


def _first_job(job_id: str, queues: Sequence[str], hashes: Sequence[Any]) -> Job | None:
    """The job from the first queue (in `queues`' order) that holds a hash for it."""
    for queue, fields in zip(queues, hashes, strict=True):
        if fields:
            return parse_job(job_id, queue, fields)
    return None


def _waited(job_id: str, job: Job | None) -> str | None:
    """None when a wait for the job is over (it finished, or it is gone), else what to say on a timeout."""
    if job is None or job.state in FINISHED:
        return None
    return f"job {job_id} in queue {job.queue} ({job.state.value})"


def _batch_status(batch_id: str, queue: str, reply: Reply) -> BatchStatus:
    total, done, dead, canceled = parse_batch(reply)
    return BatchStatus(batch_id, queue, total, done, dead, canceled)


R = TypeVar("R", SyncRedis, AsyncRedis)


class _Shell(Generic[R]):
    """The state both shells hold: the redis client they send through and the core."""

    def __init__(
        self,
        client: R,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._core = _Producer(client, namespace, max_payload_bytes)
        self.redis: R = client

    @property
    def namespace(self) -> str:
        return self._core.namespace

    @property
    def max_payload_bytes(self) -> int:
        return self._core.max_payload_bytes


class Client(_Shell[SyncRedis]):
    """Synchronous producer. Thread-safe as redis-py clients are (a connection pool underneath)."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        cluster: bool = False,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        **redis_options: Any,
    ) -> Client:
        """`cluster=True` connects to a Redis Cluster (any node's URL); a `redis+sentinel://` URL to the
        primary its sentinels name (docs/configuration.md); extra options go to redis-py."""
        _check_not_both(url, cluster)
        if cluster:
            client: SyncRedis = redis.RedisCluster.from_url(url, **redis_options)
        elif is_sentinel_url(url):
            client = sentinel_client(url, **redis_options)
        else:
            client = redis.Redis.from_url(url, **redis_options)
        return cls(client, namespace=namespace, max_payload_bytes=max_payload_bytes)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **redis_options: Any) -> Client:
        """A client for the server, namespace and payload limit of a jobcar config file. With
        `redis: {url: embedded}` it reaches the server of the `jobcar run` on that data directory (relative
        to the current directory, as for the daemon). Needs PyYAML, which a bare Spark executor may lack:
        there, use `from_url`."""
        from jobcar.config import load_config

        config = load_config(path, secrets_needed=False)
        url, cluster = config.redis.url, config.redis.cluster
        if url == EMBEDDED_URL:
            from jobcar.embedded import running_server_url

            url, cluster = running_server_url(config.redis.data_dir), False
        return cls.from_url(url, namespace=config.namespace, cluster=cluster,
                            max_payload_bytes=config.max_payload_bytes, **redis_options)  # fmt: skip

    def enqueue(self, type: str, payload: Payload = None, **options: Unpack[EnqueueOptions]) -> JobInfo:
        """Enqueue one job. The options are `EnqueueOptions` (jobcar/options.py; the README's table says
        what each does; `after` and jobs that wait for others: docs/dependencies.md).

        With `job_id`, enqueue is add-if-absent: when that id exists, nothing is written and the
        existing job is returned with status EXISTS. With `unique_for`, a job whose unique key is
        held returns the holder with status DUPLICATE.
        """
        return self._enqueue([build_record(type, payload, self.max_payload_bytes, **options)])[0]

    def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        """Enqueue many jobs in one round trip per chunk of 500 (per queue). Results in input order.

        All jobs are validated before any is sent. If Redis fails part-way, jobs of earlier chunks
        may be stored: enqueue again with the same job ids to complete the set without duplicates.
        """
        return self._enqueue(build_records(jobs, self.max_payload_bytes))

    def chain(self, steps: Iterable[JobSpec]) -> list[JobInfo]:
        """Enqueue jobs that run one after the other: each waits for the one before it (`after`), and
        its `on_dependency_failure` says what happens when that one dies or is canceled."""
        return self._enqueue(chained(build_records(steps, self.max_payload_bytes)))

    def _enqueue(self, records: list[EnqueueRecord]) -> list[JobInfo]:
        order = enqueue_order(records)
        if not order.later and len(order.stages) == 1:
            return self._store(records)
        infos = {ref_of(r): info for stage in order.stages for r, info in zip(stage, self._store(stage), strict=True)}
        registering = self._core.registrations(order, infos)
        replies = execute(self.redis, [c for _, c in registering]) if registering else []
        tellings = self._core.tellings(order, registering, replies, infos)
        if tellings:
            execute(self.redis, tellings, wait=self._core.replica_wait)
        return [infos[ref_of(r)] for r in records]

    def _store(self, records: list[EnqueueRecord]) -> list[JobInfo]:
        plan = self._core.enqueue_plan(records)
        if not plan.records:
            return []
        for queue in plan.register:
            self.redis.sadd(queues_key(self.namespace), queue)
            self._core.registered(queue)
        return parse_enqueue(plan.records, execute(self.redis, plan.calls, wait=self._core.replica_wait))

    def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        """The job with this id, or None. Without `queue`, every known queue is searched, in name order
        (an id is unique within a queue: with several, the first queue's job)."""
        queues = [queue] if queue else decode_names(self.redis.smembers(queues_key(self.namespace)))
        pipe = self.redis.pipeline(transaction=False)
        for key in self._core.job_keys(job_id, queues):
            pipe.hgetall(key)
        return _first_job(job_id, queues, pipe.execute())

    def wait(self, job_id: str, timeout: float, *, queue: str | None = None, poll: float = 0.1) -> Job | None:
        """Wait until the job has finished and return it: done (with its result while `result_ttl` keeps
        it) or dead (with its errors). None when no job has this id, or no longer: it succeeded without a
        kept result, or it was canceled. Raises TimeoutError, naming its state, after `timeout` seconds."""
        deadline = _Deadline(timeout, poll)
        while True:
            job = self.get(job_id, queue=queue)
            unfinished = _waited(job_id, job)
            if unfinished is None or job is None:
                return job
            queue = job.queue  # found: later looks read that queue only
            time.sleep(deadline.next_sleep(unfinished))

    def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        """The counters of a batch in one queue (a batch's counters live with its queue's keys)."""
        reply = self.redis.hmget(self._core.batch_key(batch_id, queue), BATCH_FIELDS)
        return _batch_status(batch_id, queue, reply)

    def seal_batch(
        self,
        batch_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        on_complete: JobSpec | None = None,
        on_success: JobSpec | None = None,
    ) -> BatchSeal:
        """Say that every job of the batch is enqueued, with the jobs to enqueue once all of them have ended:
        `on_complete` whatever their outcome, `on_success` only when none died or was canceled (else it is
        canceled). Each is (type, data) or (type, data, options); its payload is then {"batch": {queue, batch,
        total, done, dead, canceled}, "data": data}. Each is enqueued once per batch, however many daemons end
        its last jobs at once, and calling this again changes nothing (docs/dependencies.md)."""
        callbacks = self._core.callbacks(batch_id, queue, on_complete, on_success)
        infos = self._store(callbacks) if callbacks else []
        (reply,) = execute(self.redis, [self._core.seal_call(batch_id, queue, callbacks)])
        sealed, cancels = self._core.sealed(batch_id, queue, reply, infos)
        if cancels:
            execute(self.redis, cancels)
        return sealed

    def wait_batch(
        self, batch_id: str, timeout: float, *, queue: str = DEFAULT_QUEUE, poll: float = 0.2
    ) -> BatchStatus:
        """Poll the batch's counters every `poll` seconds until no job of it is pending, scheduled or
        active (`status.finished`), and return them. Raises TimeoutError, naming the last counters, when
        that takes longer than `timeout` seconds. Call it after every job was enqueued: until then the
        batch may look finished with a partial total."""
        deadline = _Deadline(timeout, poll)
        while True:
            status = self.batch_status(batch_id, queue=queue)
            if status.finished:
                return status
            time.sleep(deadline.next_sleep(status))

    # -- schedules (docs/schedules.md): kept in Redis, fired by the daemons serving their queue --------

    def upsert_schedule(self, name: str, **spec: Any) -> str:
        """Create or change a periodic job: `type`, `payload`, `queue`, `cron` or `every`, `timezone`, `start`,
        `end`, `limit`, `catchup`, `catchup_window`, `overlap`, and the job options that schedules accept
        (`options.SCHEDULE_OPTIONS`). Returns "created", "changed" or "unchanged"."""
        built = make_spec(name, max_payload_bytes=self.max_payload_bytes, **spec)
        return run_sync(self.redis, schedule_store.upsert(self.namespace, built, "api"))

    def schedule(self, name: str) -> ScheduleState | None:
        return run_sync(self.redis, schedule_store.get(self.namespace, name))

    def schedules(self) -> list[ScheduleState]:
        return run_sync(self.redis, schedule_store.every_schedule(self.namespace))

    def change_schedule(self, name: str, action: str) -> int:
        """`pause`, `resume` or `remove`: 1 changed, 0 already so, -1 no such schedule."""
        return run_sync(self.redis, schedule_store.change(self.namespace, name, _schedule_action(action)))

    def trigger_schedule(self, name: str) -> str | None:
        """One job of the schedule now (its ticks unmoved): the job's id, or None for no such schedule."""
        return run_sync(self.redis, schedule_store.trigger(self.namespace, name, self.max_payload_bytes))

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Shell[AsyncRedis]):
    """Asynchronous producer (redis.asyncio); the same methods as Client, awaited."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        cluster: bool = False,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        **redis_options: Any,
    ) -> AsyncClient:
        _check_not_both(url, cluster)
        if cluster:
            client: AsyncRedis = redis.asyncio.RedisCluster.from_url(url, **redis_options)
        elif is_sentinel_url(url):
            client = async_sentinel_client(url, **redis_options)
        else:
            client = redis.asyncio.Redis.from_url(url, **redis_options)
        return cls(client, namespace=namespace, max_payload_bytes=max_payload_bytes)

    async def enqueue(self, type: str, payload: Payload = None, **options: Unpack[EnqueueOptions]) -> JobInfo:
        return (await self._enqueue([build_record(type, payload, self.max_payload_bytes, **options)]))[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        return await self._enqueue(build_records(jobs, self.max_payload_bytes))

    async def chain(self, steps: Iterable[JobSpec]) -> list[JobInfo]:
        return await self._enqueue(chained(build_records(steps, self.max_payload_bytes)))

    async def _enqueue(self, records: list[EnqueueRecord]) -> list[JobInfo]:
        order = enqueue_order(records)
        if not order.later and len(order.stages) == 1:
            return await self._store(records)
        infos = {}
        for stage in order.stages:
            infos.update({ref_of(r): info for r, info in zip(stage, await self._store(stage), strict=True)})
        registering = self._core.registrations(order, infos)
        replies = await execute_async(self.redis, [c for _, c in registering]) if registering else []
        tellings = self._core.tellings(order, registering, replies, infos)
        if tellings:
            await execute_async(self.redis, tellings, wait=self._core.replica_wait)
        return [infos[ref_of(r)] for r in records]

    async def _store(self, records: list[EnqueueRecord]) -> list[JobInfo]:
        plan = self._core.enqueue_plan(records)
        if not plan.records:
            return []
        for queue in plan.register:
            await self.redis.sadd(queues_key(self.namespace), queue)
            self._core.registered(queue)
        return parse_enqueue(plan.records, await execute_async(self.redis, plan.calls, wait=self._core.replica_wait))

    async def seal_batch(
        self,
        batch_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        on_complete: JobSpec | None = None,
        on_success: JobSpec | None = None,
    ) -> BatchSeal:
        callbacks = self._core.callbacks(batch_id, queue, on_complete, on_success)
        infos = await self._store(callbacks) if callbacks else []
        (reply,) = await execute_async(self.redis, [self._core.seal_call(batch_id, queue, callbacks)])
        sealed, cancels = self._core.sealed(batch_id, queue, reply, infos)
        if cancels:
            await execute_async(self.redis, cancels)
        return sealed

    async def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        queues = [queue] if queue else decode_names(await self.redis.smembers(queues_key(self.namespace)))
        pipe = self.redis.pipeline(transaction=False)
        for key in self._core.job_keys(job_id, queues):
            pipe.hgetall(key)
        return _first_job(job_id, queues, await pipe.execute())

    async def wait(
        self,
        job_id: str,
        timeout: float,  # noqa: ASYNC109 -- Client's signature: the TimeoutError names the job's state
        *,
        queue: str | None = None,
        poll: float = 0.1,
    ) -> Job | None:
        deadline = _Deadline(timeout, poll)
        while True:
            job = await self.get(job_id, queue=queue)
            unfinished = _waited(job_id, job)
            if unfinished is None or job is None:
                return job
            queue = job.queue  # found: later looks read that queue only
            await asyncio.sleep(deadline.next_sleep(unfinished))

    async def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        reply = await self.redis.hmget(self._core.batch_key(batch_id, queue), BATCH_FIELDS)
        return _batch_status(batch_id, queue, reply)

    # Client's signature on purpose (not asyncio.timeout): the TimeoutError names the last counters.
    async def wait_batch(
        self,
        batch_id: str,
        timeout: float,  # noqa: ASYNC109
        *,
        queue: str = DEFAULT_QUEUE,
        poll: float = 0.2,
    ) -> BatchStatus:
        deadline = _Deadline(timeout, poll)
        while True:
            status = await self.batch_status(batch_id, queue=queue)
            if status.finished:
                return status
            await asyncio.sleep(deadline.next_sleep(status))

    async def upsert_schedule(self, name: str, **spec: Any) -> str:
        built = make_spec(name, max_payload_bytes=self.max_payload_bytes, **spec)
        return await run_async(self.redis, schedule_store.upsert(self.namespace, built, "api"))

    async def schedule(self, name: str) -> ScheduleState | None:
        return await run_async(self.redis, schedule_store.get(self.namespace, name))

    async def schedules(self) -> list[ScheduleState]:
        return await run_async(self.redis, schedule_store.every_schedule(self.namespace))

    async def change_schedule(self, name: str, action: str) -> int:
        return await run_async(self.redis, schedule_store.change(self.namespace, name, _schedule_action(action)))

    async def trigger_schedule(self, name: str) -> str | None:
        return await run_async(self.redis, schedule_store.trigger(self.namespace, name, self.max_payload_bytes))

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
