"""`spark.read.format("jobcar")`: the jobs of a queue (of one batch, in some states) as a DataFrame, one row
per job with the fields of `job_document`, read in parallel partitions.

    spark.read.format("jobcar").option("url", URL).option("batch", "orders-2026-11-28").load()
    spark.read.format("jobcar").option("url", URL).option("queue", "mail").option("state", "dead").load()

On the driver, `partitions` lists the ids only: from the states' sets (ZRANGE / LRANGE pages) when every
state asked has one, else by SCAN over the queue's job hashes (done jobs are in no set), `SCAN_COUNT` keys a
call. Each partition (`partition_size` ids) then reads its jobs on an executor, HGETALL pipelined
`READ_CHUNK` at a time, and keeps those of the batch and states asked. Every Redis call is bounded; the
whole read is no snapshot: a job that changes state meanwhile is read as it is when its partition reads it,
and one that is gone by then (succeeded without a kept result, canceled) is left out.
"""

from __future__ import annotations

from jobcar import spark_compat  # noqa: F401 -- first: what the modules below use of 3.10 and 3.11, on 3.9

# isort: split

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, cast

import redis
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from jobcar.errors import InvalidJob
from jobcar.job import STORED_IN_SETS, Job, State
from jobcar.keys import DEFAULT_QUEUE, QueueKeys
from jobcar.names import ID_PATTERN, check_name
from jobcar.replies import as_text, parse_job
from jobcar.spark_rows import Connection, utc

#: Ids a partition reads, unless the option partition_size says otherwise.
PARTITION_SIZE: Final = 5_000
#: Job hashes one pipelined round trip reads.
READ_CHUNK: Final = 500
#: SCAN's COUNT, and the page of a ZRANGE or LRANGE, on the driver.
SCAN_COUNT: Final = 1_000
#: A payload or result up to this many bytes of UTF-8 is text; a larger or non-UTF-8 one is binary only.
TEXT_LIMIT: Final = 1 << 20

_TIME = TimestampType()
JOB_SCHEMA: Final = StructType(
    [
        StructField("id", StringType(), False),
        StructField("queue", StringType(), False),
        StructField("type", StringType(), False),
        StructField("state", StringType(), False),
        StructField("attempt", IntegerType(), False),
        StructField("max_attempts", IntegerType(), True),
        StructField("priority", IntegerType(), False),
        StructField("batch", StringType(), True),
        StructField("key", StringType(), True),
        StructField("meta", MapType(StringType(), StringType()), False),
        StructField("created_at", _TIME, True),
        StructField("run_at", _TIME, True),
        StructField("started_at", _TIME, True),
        StructField("finished_at", _TIME, True),
        StructField("expires_at", _TIME, True),
        StructField("content_type", StringType(), False),
        # Text when it is UTF-8 and at most text_limit bytes, else null and the bytes in the *_binary column.
        StructField("payload", StringType(), True),
        StructField("payload_binary", BinaryType(), True),
        StructField("result", StringType(), True),
        StructField("result_binary", BinaryType(), True),
        StructField("result_dropped", StringType(), True),
        StructField("last_error", StringType(), True),
        StructField(
            "errors",
            ArrayType(
                StructType(
                    [
                        StructField("attempt", IntegerType(), False),
                        StructField("at", _TIME, True),
                        StructField("error", StringType(), False),
                    ]
                ),
                False,
            ),
            False,
        ),
        StructField("after", ArrayType(StringType(), False), False),
        StructField("unique_key", StringType(), True),
        StructField("schedule", StringType(), True),
    ]
)


class IdsPartition(InputPartition):
    """The ids one task reads."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(ids)
        self.ids = ids


def _states(text: str | None) -> tuple[State, ...]:
    if text is None:
        return ()
    states = []
    for name in text.split(","):
        try:
            states.append(State(name.strip().lower()))
        except ValueError:
            known = ", ".join(s.value for s in State if s is not State.CANCELED)
            raise InvalidJob(f"state {name.strip()!r} is none of {known}") from None
    return tuple(dict.fromkeys(states))


def _positive(name: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise InvalidJob(f"option {name} must be a positive whole number, got {text!r}")
    return int(text)


class JobcarReader(DataSourceReader):
    def __init__(self, connection: Connection, options: Mapping[str, str]) -> None:
        self.connection = connection
        self.queue = check_name("queue name", options.get("queue") or DEFAULT_QUEUE)
        batch = options.get("batch")
        self.batch = None if batch is None else check_name("batch id", batch, ID_PATTERN)
        self.states = _states(options.get("state"))
        self.partition_size = _positive("partition_size", options.get("partition_size"), PARTITION_SIZE)
        self.text_limit = _positive("text_limit", options.get("text_limit"), TEXT_LIMIT)

    # -- the driver ---------------------------------------------------------------------------------

    def partitions(self) -> Sequence[IdsPartition]:
        self.connection.check()
        ids = self._ids()
        size = self.partition_size
        return [IdsPartition(ids[start : start + size]) for start in range(0, len(ids), size)]

    def _ids(self) -> list[str]:
        keys = QueueKeys.of(self.connection.namespace, self.queue)
        with self.connection.client() as client:
            if self.states and all(s in STORED_IN_SETS for s in self.states):
                found: list[str] = []
                for state in self.states:
                    found += _set_ids(client.redis, keys, state)
                return list(dict.fromkeys(found))  # a job moving between sets meanwhile is read once
            return _scanned_ids(client.redis, keys)

    # -- the executors ------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdsPartition)
        keys = QueueKeys.of(self.connection.namespace, self.queue)
        with self.connection.client() as client:
            for start in range(0, len(partition.ids), READ_CHUNK):
                chunk = partition.ids[start : start + READ_CHUNK]
                pipe = client.redis.pipeline(transaction=False)
                for job_id in chunk:
                    pipe.hgetall(keys.job(job_id))
                for job_id, fields in zip(chunk, pipe.execute(), strict=True):
                    if not fields:
                        continue  # gone since it was listed
                    job = parse_job(job_id, self.queue, fields)
                    if self.batch is not None and job.batch != self.batch:
                        continue
                    if self.states and job.state not in self.states:
                        continue
                    yield self.row(job)

    def row(self, job: Job) -> tuple[Any, ...]:
        payload, payload_binary = self._text_or_bytes(job.payload)
        result, result_binary = self._text_or_bytes(job.result)
        errors = [(e.attempt, utc(e.at_ms), e.error) for e in job.errors]
        return (
            job.id, job.queue, job.type, job.state.value, job.attempt, job.max_attempts, job.priority, job.batch,
            job.limit_key, dict(job.meta), utc(job.created_ms or None), utc(job.run_at_ms), utc(job.started_ms),
            utc(job.finished_ms), utc(job.expires_at_ms), job.content_type, payload, payload_binary, result,
            result_binary, job.result_dropped, errors[-1][2] if errors else None, errors, list(job.after),
            job.unique_key, job.schedule,
        )  # fmt: skip

    def _text_or_bytes(self, value: bytes | None) -> tuple[str | None, bytes | None]:
        if value is None:
            return None, None
        if len(value) <= self.text_limit:
            try:
                return value.decode("utf-8"), None
            except UnicodeDecodeError:
                pass
        return None, bytes(value)


def _set_ids(client: Any, keys: QueueKeys, state: State) -> list[str]:
    """The ids of a state's set(s), `SCAN_COUNT` a call."""
    ids: list[str] = []
    if state is State.PENDING:
        for key in keys.pending_lists:
            start = 0
            while page := cast(list[bytes], client.lrange(key, start, start + SCAN_COUNT - 1)):
                ids += [as_text(m) for m in page]
                start += SCAN_COUNT
        return ids
    sets = {State.SCHEDULED: keys.scheduled, State.ACTIVE: keys.active, State.DEAD: keys.dead,
            State.WAITING: keys.waiting}  # fmt: skip
    start = 0
    while page := cast(list[bytes], client.zrange(sets[state], start, start + SCAN_COUNT - 1)):
        ids += [as_text(m) for m in page]
        start += SCAN_COUNT
    return ids


def _scanned_ids(client: Any, keys: QueueKeys) -> list[str]:
    """Every job hash's id of the queue, by SCAN (`SCAN_COUNT` a call); on a cluster, on the queue's node."""
    prefix = len(keys.job(""))
    extra: dict[str, Any] = {}
    if isinstance(client, redis.RedisCluster):  # every key of a queue is in its slot, on one node
        extra["target_nodes"] = client.get_node_from_key(keys.pending)  # type: ignore[no-untyped-call]
    ids = {as_text(k)[prefix:] for k in client.scan_iter(match=keys.all_jobs(), count=SCAN_COUNT, **extra)}
    return sorted(ids)
