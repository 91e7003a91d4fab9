"""The producer client: enqueue jobs from any Python process, including a Spark executor.

    from jobcar import Client
    jobs = Client.from_url("redis://127.0.0.1:6379/0")
    info = jobs.enqueue("email.welcome", {"user": 42}, queue="critical")

`Client` and `AsyncClient` are two thin I/O shells over one core (`producer.Producer`), whose methods are
operations written once, without I/O: each method of a shell runs one over its redis client,
synchronously (`transport.run_sync`) or awaited (`transport.run_async`). Only the standard library and
redis-py are imported, so `from jobcar import Client` works on a machine (or in a zip shipped with
`addPyFile`) that has nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Generic, TypeVar, Unpack

import redis
import redis.asyncio

from jobcar.job import Job, JobInfo
from jobcar.keys import DEFAULT_NAMESPACE, DEFAULT_QUEUE
from jobcar.options import EnqueueOptions
from jobcar.producer import BatchSeal, BatchStatus, Producer
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES, JobSpec, Payload
from jobcar.redis_url import EMBEDDED_URL, is_sentinel_url
from jobcar.schedules import ScheduleState
from jobcar.sentinel import async_sentinel_client, sentinel_client
from jobcar.transport import AsyncRedis, RoundTrips, SyncRedis, run_async, run_sync

__all__ = ["AsyncClient", "BatchSeal", "BatchStatus", "Client"]


def _check_not_both(url: str, cluster: bool) -> None:
    if cluster and is_sentinel_url(url):
        raise ValueError("a Redis Cluster is not found through Sentinel: give cluster=True a node's redis:// URL")


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
        self._core = Producer(client, namespace, max_payload_bytes)
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
        to the current directory, as for the daemon). It knows the config's handlers and queues: a job of a
        type no handler runs, or to a queue the config does not serve, gives a `TargetWarning` (with
        `strict_enqueue`, an InvalidJob, and nothing is written). Needs PyYAML, which a bare Spark executor
        may lack: there, use `from_url`."""
        from jobcar.config import load_config

        config = load_config(path, secrets_needed=False)
        url, cluster = config.redis.url, config.redis.cluster
        if url == EMBEDDED_URL:
            from jobcar.embedded import running_server_url

            url, cluster = running_server_url(config.redis.data_dir), False
        client = cls.from_url(url, namespace=config.namespace, cluster=cluster,
                              max_payload_bytes=config.max_payload_bytes, **redis_options)  # fmt: skip
        client._core.targets = config.known_targets()
        return client

    def enqueue(self, type: str, payload: Payload = None, **options: Unpack[EnqueueOptions]) -> JobInfo:
        """Enqueue one job. The options are `EnqueueOptions` (jobcar/options.py; the README's table says
        what each does; `after` and jobs that wait for others: docs/dependencies.md).

        With `job_id`, enqueue is add-if-absent: when that id exists, nothing is written and the
        existing job is returned with status EXISTS. With `unique_for`, a job whose unique key is
        held returns the holder with status DUPLICATE.
        """
        return run_sync(self.redis, self._core.enqueue_one(type, payload, options))

    def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        """Enqueue many jobs in one round trip per chunk of 500 (per queue). Results in input order.

        All jobs are validated before any is sent. If Redis fails part-way, jobs of earlier chunks
        may be stored: enqueue again with the same job ids to complete the set without duplicates.
        """
        return run_sync(self.redis, self._core.enqueue_many(jobs))

    def chain(self, steps: Iterable[JobSpec]) -> list[JobInfo]:
        """Enqueue jobs that run one after the other: each waits for the one before it (`after`), and
        its `on_dependency_failure` says what happens when that one dies or is canceled."""
        return run_sync(self.redis, self._core.chain(steps))

    def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        """The job with this id, or None. Without `queue`, every known queue is searched, in name order
        (an id is unique within a queue: with several, the first queue's job)."""
        return run_sync(self.redis, self._core.get(job_id, queue))

    def wait(self, job_id: str, timeout: float, *, queue: str | None = None, poll: float = 0.1) -> Job | None:
        """Wait until the job has finished and return it: done (with its result while `result_ttl` keeps
        it; under `result_ttl: 0` its ack keeps it a while for this wait, without a result) or dead (with its
        errors). None when no job has this id, or no longer: it was canceled, or it ended before this wait
        first found it. Raises TimeoutError, naming its state, after `timeout` seconds."""
        return run_sync(self.redis, self._core.wait(job_id, timeout, queue, poll))

    def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        """The counters of a batch in one queue (a batch's counters live with its queue's keys)."""
        return run_sync(self.redis, self._core.batch_status(batch_id, queue))

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
        return run_sync(self.redis, self._core.seal_batch(batch_id, queue, on_complete, on_success))

    def wait_batch(
        self, batch_id: str, timeout: float, *, queue: str = DEFAULT_QUEUE, poll: float = 0.2
    ) -> BatchStatus:
        """Poll the batch's counters every `poll` seconds until no job of it is pending, scheduled or
        active (`status.finished`), and return them. Raises TimeoutError, naming the last counters, when
        that takes longer than `timeout` seconds. Call it after every job was enqueued: until then the
        batch may look finished with a partial total."""
        return run_sync(self.redis, self._core.wait_batch(batch_id, timeout, queue, poll))

    # -- schedules (docs/schedules.md): kept in Redis, fired by the daemons serving their queue --------

    def upsert_schedule(self, name: str, **spec: Any) -> str:
        """Create or change a periodic job: `type`, `payload`, `queue`, `cron` or `every`, `timezone`, `start`,
        `end`, `limit`, `catchup`, `catchup_window`, `overlap`, and the job options that schedules accept
        (`options.SCHEDULE_OPTIONS`). Returns "created", "changed" or "unchanged"."""
        return run_sync(self.redis, self._core.upsert_schedule(name, spec))

    def schedule(self, name: str) -> ScheduleState | None:
        return run_sync(self.redis, self._core.schedule(name))

    def schedules(self) -> list[ScheduleState]:
        return run_sync(self.redis, self._core.schedules())

    def change_schedule(self, name: str, action: str) -> int:
        """`pause`, `resume` or `remove`: 1 changed, 0 already so, -1 no such schedule."""
        return run_sync(self.redis, self._core.change_schedule(name, action))

    def trigger_schedule(self, name: str) -> str | None:
        """One job of the schedule now (its ticks unmoved): the job's id, or None for no such schedule."""
        return run_sync(self.redis, self._core.trigger_schedule(name))

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Shell[AsyncRedis]):
    """Asynchronous producer (redis.asyncio); the same methods as Client, awaited.

    `shared_round_trips`: the calls of many tasks using this client at once share round trips (one pipeline
    for the calls made while a round trip is on the wire, each with its own answer; a call made while none is
    goes at once: `RoundTrips`). For a server enqueueing for many concurrent producers, as the daemon's HTTP API
    does."""

    def __init__(
        self,
        client: AsyncRedis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        shared_round_trips: bool = False,
    ) -> None:
        super().__init__(client, namespace=namespace, max_payload_bytes=max_payload_bytes)
        self.round_trips = RoundTrips(client) if shared_round_trips else None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        cluster: bool = False,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        shared_round_trips: bool = False,
        **redis_options: Any,
    ) -> AsyncClient:
        _check_not_both(url, cluster)
        if cluster:
            client: AsyncRedis = redis.asyncio.RedisCluster.from_url(url, **redis_options)
        elif is_sentinel_url(url):
            client = async_sentinel_client(url, **redis_options)
        else:
            client = redis.asyncio.Redis.from_url(url, **redis_options)
        return cls(client, namespace=namespace, max_payload_bytes=max_payload_bytes,
                   shared_round_trips=shared_round_trips)  # fmt: skip

    async def enqueue(self, type: str, payload: Payload = None, **options: Unpack[EnqueueOptions]) -> JobInfo:
        return await run_async(self.redis, self._core.enqueue_one(type, payload, options), self.round_trips)

    async def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        return await run_async(self.redis, self._core.enqueue_many(jobs), self.round_trips)

    async def chain(self, steps: Iterable[JobSpec]) -> list[JobInfo]:
        return await run_async(self.redis, self._core.chain(steps), self.round_trips)

    async def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        return await run_async(self.redis, self._core.get(job_id, queue), self.round_trips)

    async def wait(
        self,
        job_id: str,
        timeout: float,  # noqa: ASYNC109 -- Client's signature: the TimeoutError names the job's state
        *,
        queue: str | None = None,
        poll: float = 0.1,
    ) -> Job | None:
        return await run_async(self.redis, self._core.wait(job_id, timeout, queue, poll), self.round_trips)

    async def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        return await run_async(self.redis, self._core.batch_status(batch_id, queue), self.round_trips)

    async def seal_batch(
        self,
        batch_id: str,
        *,
        queue: str = DEFAULT_QUEUE,
        on_complete: JobSpec | None = None,
        on_success: JobSpec | None = None,
    ) -> BatchSeal:
        return await run_async(
            self.redis, self._core.seal_batch(batch_id, queue, on_complete, on_success), self.round_trips
        )

    # Client's signature on purpose (not asyncio.timeout): the TimeoutError names the last counters.
    async def wait_batch(
        self,
        batch_id: str,
        timeout: float,  # noqa: ASYNC109
        *,
        queue: str = DEFAULT_QUEUE,
        poll: float = 0.2,
    ) -> BatchStatus:
        return await run_async(self.redis, self._core.wait_batch(batch_id, timeout, queue, poll), self.round_trips)

    async def upsert_schedule(self, name: str, **spec: Any) -> str:
        return await run_async(self.redis, self._core.upsert_schedule(name, spec), self.round_trips)

    async def schedule(self, name: str) -> ScheduleState | None:
        return await run_async(self.redis, self._core.schedule(name), self.round_trips)

    async def schedules(self) -> list[ScheduleState]:
        return await run_async(self.redis, self._core.schedules(), self.round_trips)

    async def change_schedule(self, name: str, action: str) -> int:
        return await run_async(self.redis, self._core.change_schedule(name, action), self.round_trips)

    async def trigger_schedule(self, name: str) -> str | None:
        return await run_async(self.redis, self._core.trigger_schedule(name), self.round_trips)

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
