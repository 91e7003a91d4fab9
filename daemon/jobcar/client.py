"""The producer client: enqueue jobs from any Python process, including a Spark executor.

    from jobcar import Client
    jobs = Client.from_url("redis://127.0.0.1:6379/0")
    info = jobs.enqueue("email.welcome", {"user": 42}, queue="critical")

Only the standard library and redis-py are imported here, directly or through store/job/errors, so
`from jobcar import Client` works on a machine (or in a zip shipped with `addPyFile`) that has
nothing else. `AsyncClient` has the same methods, awaited.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Final, TypeAlias

import redis
import redis.asyncio

from jobcar import keys, replies, transitions, transport
from jobcar.errors import InvalidJob, PayloadTooLarge
from jobcar.job import DEFAULT_CONTENT_TYPE, Job, JobInfo
from jobcar.keys import DEFAULT_NAMESPACE, DEFAULT_QUEUE, QueueKeys
from jobcar.transitions import EnqueueRecord

#: A payload is either a JSON-serialisable value (sent as application/json) or raw bytes.
Payload: TypeAlias = Any
Seconds: TypeAlias = float | timedelta
#: An item of enqueue_many: (type, payload) or (type, payload, {option: value, ...}).
JobSpec: TypeAlias = tuple[str, Payload] | tuple[str, Payload, Mapping[str, Any]]

DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
RAW_CONTENT_TYPE: Final = "application/octet-stream"

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # namespaces and queues
TYPE_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
# Ids and unique keys end up in key names: any printable text without spaces, bounded.
ID_PATTERN: Final = re.compile(r"[\x21-\x7e\u00a0-\U0010ffff]{1,200}")
TRACEPARENT_PATTERN: Final = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_META_BYTES: Final = 4096

ENQUEUE_OPTIONS: Final = frozenset(
    {"queue", "delay", "run_at", "max_attempts", "unique_for", "unique_key", "job_id", "timeout",
     "content_type", "traceparent", "meta", "batch"}
)  # fmt: skip


def _unserialisable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder() -> Callable[[object], str]:
    """Compact JSON, no NaN or infinity, non-ASCII kept. The C encoder called directly: what
    `JSONEncoder.encode` does on top (a new C encoder per call, a circular-reference table) cost as much
    as the encoding itself for a typical 100-byte payload (1.8 vs 1.0 µs), paid per job by enqueue_many.
    Without the table a circular payload ends in RecursionError, which encode_payload reports."""
    make_encoder: Callable[..., Callable[[object, int], list[str]]] | None
    make_encoder = getattr(json.encoder, "c_make_encoder", None)  # not in typeshed
    if make_encoder is None:  # an interpreter without the C accelerator
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    # markers, default, string encoder, indent, separators, sort_keys, skipkeys, allow_nan
    iterencode = make_encoder(None, _unserialisable, json.encoder.encode_basestring, None, ":", ",", False, False,
                              False)  # fmt: skip
    return lambda value: "".join(iterencode(value, 0))


_json_encode = _json_encoder()


#: Job ids are drawn this many at a time: one urandom call and one base64 pass instead of one each per id
#: (0.25 vs 0.8 µs an id; enqueue_many pays it per job).
IDS_PER_DRAW: Final = 64
_ID_BYTES: Final = 15  # 120 random bits: 20 URL-safe base64 characters, no padding
_spare_ids: deque[str] = deque()
# A forked child (a Spark Python worker, a multiprocessing pool) must not hand out its parent's spare ids.
os.register_at_fork(after_in_child=_spare_ids.clear)


def new_job_id() -> str:
    """120 random bits as 20 URL-safe base64 characters: short (an id is stored several times per job).
    Never starting with "-", which a command line would take for an option (`jobcar cancel ID`).
    Thread-safe: deque's popleft and extend are atomic."""
    while True:
        try:
            job_id = _spare_ids.popleft()
        except IndexError:
            # base64 turns every 3 bytes into 4 characters on its own, so the text of 64 draws of 15
            # bytes is the 64 ids back to back.
            text = base64.urlsafe_b64encode(os.urandom(_ID_BYTES * IDS_PER_DRAW)).decode("ascii")
            _spare_ids.extend([text[i : i + 20] for i in range(0, len(text), 20)])
            continue
        if job_id[0] != "-":
            return job_id


@lru_cache(maxsize=1024)
def _matches(pattern: re.Pattern[str], value: str) -> bool:
    # Producers reuse a handful of types and queues: remember the answers (a hot path in enqueue_many).
    return pattern.fullmatch(value) is not None


def check_name(what: str, value: object, pattern: re.Pattern[str] = NAME_PATTERN) -> str:
    if not isinstance(value, str) or not _matches(pattern, value):
        raise InvalidJob(f"invalid {what} {value!r}: expected text matching {pattern.pattern}")
    return value


#: Longer than anyone delays a job; beyond it a number is a mistake (milliseconds given as seconds, say).
MAX_SECONDS: Final = 100 * 365 * 86400.0
#: The last second of year 9999, the largest run-at an RFC 3339 time can name.
MAX_EPOCH_SECONDS: Final = 253_402_300_799.0


def _seconds(what: str, value: object, maximum: float = MAX_SECONDS) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(f"{what} must be seconds (a number) or a timedelta, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or value > maximum:
        raise InvalidJob(f"{what} must be a finite number of seconds from 0 to {maximum:.0f}, got {value}")
    return float(value)


def _epoch_ms(value: object) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidJob("run_at must be a timezone-aware datetime (or epoch seconds)")
        return int(value.timestamp() * 1000)
    return int(_seconds("run_at", value, MAX_EPOCH_SECONDS) * 1000)


def encode_payload(payload: Payload, content_type: str | None, max_bytes: int) -> tuple[bytes, str | None]:
    """Bytes go as they are; anything else is encoded as JSON. Returns (body, content type to store),
    where None stands for the default, application/json."""
    if isinstance(payload, bytes | bytearray | memoryview):
        body = bytes(payload)
        ctype = content_type or RAW_CONTENT_TYPE
    else:
        if content_type not in (None, DEFAULT_CONTENT_TYPE):
            raise InvalidJob(f"content_type {content_type!r} needs a bytes payload; other values are sent as JSON")
        try:
            body = _json_encode(payload).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
        except RecursionError:
            raise InvalidJob("payload is not JSON-serialisable: it refers to itself or nests too deeply") from None
        ctype = DEFAULT_CONTENT_TYPE
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"payload is {len(body)} bytes, over the limit of {max_bytes} bytes")
    return body, None if ctype == DEFAULT_CONTENT_TYPE else ctype


def build_record(job_type: str, payload: Payload, max_payload_bytes: int, **options: Any) -> EnqueueRecord:
    """Validate one job and encode it for the enqueue script. Every problem is an InvalidJob."""
    check_name("job type", job_type, TYPE_PATTERN)
    if not options:
        # The common case of enqueue_many, kept cheap: every option at its default (EnqueueRecord's).
        body, content_type = encode_payload(payload, None, max_payload_bytes)
        return EnqueueRecord(new_job_id(), DEFAULT_QUEUE, job_type, body, content_type=content_type)
    unknown = options.keys() - ENQUEUE_OPTIONS
    if unknown:
        raise InvalidJob(f"unknown enqueue option(s): {', '.join(sorted(unknown))}")
    queue = check_name("queue name", options.get("queue") or DEFAULT_QUEUE)
    body, content_type = encode_payload(payload, options.get("content_type"), max_payload_bytes)

    delay, run_at = options.get("delay"), options.get("run_at")
    if delay is not None and run_at is not None:
        raise InvalidJob("give delay or run_at, not both")
    delay_ms = 0 if delay is None else int(_seconds("delay", delay) * 1000)
    run_at_ms = 0 if run_at is None else _epoch_ms(run_at)

    job_id = options.get("job_id")
    job_id = new_job_id() if job_id is None else check_name("job_id", job_id, ID_PATTERN)

    unique_key, unique_for = options.get("unique_key"), options.get("unique_for")
    unique_ttl_ms = 0
    if unique_key is not None and unique_for is None:
        raise InvalidJob("unique_key needs unique_for: the lock's lifetime, so a crash never leaves it forever")
    if unique_for is not None:
        unique_ttl_ms = int(_seconds("unique_for", unique_for) * 1000)
        if unique_ttl_ms <= 0:
            raise InvalidJob("unique_for must be positive")
        if unique_key is None:
            # Same type and payload in the same queue = the same job.
            unique_key = f"{job_type}:{hashlib.sha256(body).hexdigest()[:32]}"
        else:
            check_name("unique_key", unique_key, ID_PATTERN)

    max_attempts = options.get("max_attempts")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise InvalidJob(f"max_attempts must be a positive integer, got {max_attempts!r}")
    timeout = options.get("timeout")
    timeout_ms = None if timeout is None else int(_seconds("timeout", timeout) * 1000)
    if timeout_ms is not None and timeout_ms <= 0:
        raise InvalidJob("timeout must be positive")

    traceparent = options.get("traceparent")
    if traceparent is not None and not TRACEPARENT_PATTERN.fullmatch(str(traceparent)):
        raise InvalidJob(f"traceparent {traceparent!r} is not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
    meta = options.get("meta") or {}
    if meta:
        if not isinstance(meta, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise InvalidJob("meta must be a mapping of strings to strings")
        if len(_json_encode(dict(meta))) > MAX_META_BYTES:
            raise InvalidJob(f"meta is over {MAX_META_BYTES} bytes")
    batch = options.get("batch")
    if batch is not None:
        check_name("batch id", batch, ID_PATTERN)

    return EnqueueRecord(
        id=job_id,
        queue=queue,
        type=job_type,
        payload=body,
        content_type=content_type,
        run_at_ms=run_at_ms,
        delay_ms=delay_ms,
        unique_key=unique_key,
        unique_ttl_ms=unique_ttl_ms,
        max_attempts=max_attempts,
        timeout_ms=timeout_ms,
        traceparent=traceparent,
        meta=meta,
        batch=batch,
    )


def build_records(specs: Iterable[JobSpec], max_payload_bytes: int) -> list[EnqueueRecord]:
    records = []
    for n, spec in enumerate(specs):
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise InvalidJob(f"job #{n}: expected (type, payload) or (type, payload, options), got {spec!r}")
        options = spec[2] if len(spec) == 3 else {}
        try:
            records.append(build_record(spec[0], spec[1], max_payload_bytes, **options))
        except InvalidJob as exc:
            raise type(exc)(f"job #{n}: {exc}") from None
    return records


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


def _batch_key(namespace: str, batch_id: str, queue: str) -> str:
    check_name("batch id", batch_id, ID_PATTERN)
    return QueueKeys.of(namespace, check_name("queue name", queue)).batch(batch_id)


def _check_wait(timeout: float, poll: float) -> None:
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    if not (math.isfinite(poll) and poll > 0):
        raise ValueError(f"poll must be a positive number of seconds, got {poll!r}")


def _batch_timeout(status: BatchStatus, timeout: float) -> TimeoutError:
    return TimeoutError(f"{status} still unfinished after {timeout:g} s")


def _check_client(client: transport.SyncRedis | transport.AsyncRedis) -> None:
    pool = getattr(client, "connection_pool", None)
    encoder = pool.get_encoder() if pool is not None else client.get_encoder()
    if encoder.decode_responses:
        raise ValueError("jobcar needs a redis client created with decode_responses=False (payloads are bytes)")


class _Base:
    def __init__(self, namespace: str, max_payload_bytes: int) -> None:
        self.namespace = check_name("namespace", namespace)
        self.max_payload_bytes = max_payload_bytes
        self._registered_queues: set[str] = set()

    def _queues_to_register(self, records: Sequence[EnqueueRecord]) -> list[str]:
        return sorted({r.queue for r in records} - self._registered_queues)


class Client(_Base):
    """Synchronous producer. Thread-safe as redis-py clients are (a connection pool underneath)."""

    def __init__(
        self,
        client: transport.SyncRedis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(namespace, max_payload_bytes)
        _check_client(client)
        self.redis = client

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
        """`cluster=True` connects to a Redis Cluster (any node's URL); extra options go to redis-py."""
        if cluster:
            client: transport.SyncRedis = redis.RedisCluster.from_url(url, **redis_options)
        else:
            client = redis.Redis.from_url(url, **redis_options)
        return cls(client, namespace=namespace, max_payload_bytes=max_payload_bytes)

    def enqueue(self, type: str, payload: Payload = None, **options: Any) -> JobInfo:
        """Enqueue one job. Options: queue, delay, run_at, max_attempts, unique_for, unique_key, job_id,
        timeout, content_type, traceparent, meta, batch (see the README and docs/protocol.md).

        With `job_id`, enqueue is add-if-absent: when that id exists, nothing is written and the
        existing job is returned with status EXISTS. With `unique_for`, a job whose unique key is
        held returns the holder with status DUPLICATE.
        """
        return self.enqueue_many([(type, payload, options)])[0]

    def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        """Enqueue many jobs in one round trip per chunk of 500 (per queue). Results in input order.

        All jobs are validated before any is sent. If Redis fails part-way, jobs of earlier chunks
        may be stored: enqueue again with the same job ids to complete the set without duplicates.
        """
        records = build_records(jobs, self.max_payload_bytes)
        if not records:
            return []
        for queue in self._queues_to_register(records):
            self.redis.sadd(keys.queues_key(self.namespace), queue)
            self._registered_queues.add(queue)
        replies = transport.execute(self.redis, transitions.enqueue_calls(self.namespace, records))
        return transitions.parse_enqueue(records, replies)

    def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        """The job with this id, or None. Without `queue`, every known queue is searched."""
        queues = [queue] if queue else replies.decode_names(self.redis.smembers(keys.queues_key(self.namespace)))
        for q in queues:
            fields = self.redis.hgetall(QueueKeys.of(self.namespace, q).job(job_id))
            if fields:
                return replies.parse_job(job_id, q, fields)
        return None

    def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        """The counters of a batch in one queue (a batch's counters live with its queue's keys)."""
        key = _batch_key(self.namespace, batch_id, queue)
        total, done, dead, canceled = replies.parse_batch(self.redis.hmget(key, replies.BATCH_FIELDS))
        return BatchStatus(batch_id, queue, total, done, dead, canceled)

    def wait_batch(
        self, batch_id: str, timeout: float, *, queue: str = DEFAULT_QUEUE, poll: float = 0.2
    ) -> BatchStatus:
        """Poll the batch's counters every `poll` seconds until no job of it is pending, scheduled or
        active (`status.finished`), and return them. Raises TimeoutError, naming the last counters, when
        that takes longer than `timeout` seconds. Call it after every job was enqueued: until then the
        batch may look finished with a partial total."""
        _check_wait(timeout, poll)
        deadline = time.monotonic() + timeout
        while True:
            status = self.batch_status(batch_id, queue=queue)
            if status.finished:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                raise _batch_timeout(status, timeout)
            time.sleep(min(poll, left))

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    """Asynchronous producer (redis.asyncio); the same methods as Client, awaited."""

    def __init__(
        self,
        client: transport.AsyncRedis,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        super().__init__(namespace, max_payload_bytes)
        _check_client(client)
        self.redis = client

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
        if cluster:
            client: transport.AsyncRedis = redis.asyncio.RedisCluster.from_url(url, **redis_options)
        else:
            client = redis.asyncio.Redis.from_url(url, **redis_options)
        return cls(client, namespace=namespace, max_payload_bytes=max_payload_bytes)

    async def enqueue(self, type: str, payload: Payload = None, **options: Any) -> JobInfo:
        return (await self.enqueue_many([(type, payload, options)]))[0]

    async def enqueue_many(self, jobs: Iterable[JobSpec]) -> list[JobInfo]:
        records = build_records(jobs, self.max_payload_bytes)
        if not records:
            return []
        for queue in self._queues_to_register(records):
            await self.redis.sadd(keys.queues_key(self.namespace), queue)
            self._registered_queues.add(queue)
        replies = await transport.execute_async(self.redis, transitions.enqueue_calls(self.namespace, records))
        return transitions.parse_enqueue(records, replies)

    async def get(self, job_id: str, *, queue: str | None = None) -> Job | None:
        queues = [queue] if queue else replies.decode_names(await self.redis.smembers(keys.queues_key(self.namespace)))
        for q in queues:
            fields = await self.redis.hgetall(QueueKeys.of(self.namespace, q).job(job_id))
            if fields:
                return replies.parse_job(job_id, q, fields)
        return None

    async def batch_status(self, batch_id: str, *, queue: str = DEFAULT_QUEUE) -> BatchStatus:
        key = _batch_key(self.namespace, batch_id, queue)
        total, done, dead, canceled = replies.parse_batch(await self.redis.hmget(key, replies.BATCH_FIELDS))
        return BatchStatus(batch_id, queue, total, done, dead, canceled)

    # Client's signature on purpose (not asyncio.timeout): the TimeoutError names the last counters.
    async def wait_batch(
        self,
        batch_id: str,
        timeout: float,  # noqa: ASYNC109
        *,
        queue: str = DEFAULT_QUEUE,
        poll: float = 0.2,
    ) -> BatchStatus:
        _check_wait(timeout, poll)
        deadline = time.monotonic() + timeout
        while True:
            status = await self.batch_status(batch_id, queue=queue)
            if status.finished:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                raise _batch_timeout(status, timeout)
            await asyncio.sleep(min(poll, left))

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
