"""The `jobcar` format of Spark 4's Python data sources: `df.write.format("jobcar")` enqueues a job per row,
`df.writeStream.format("jobcar")` per row of each micro-batch, and `spark.read.format("jobcar")` reads jobs
back as a DataFrame (spark_read.py).

    from jobcar.spark_source import JobcarDataSource
    spark.dataSource.register(JobcarDataSource)
    (orders.write.format("jobcar").option("url", URL).option("type", "order.ship").option("id", "order_id")
        .option("batch", "orders-2026-11-28").mode("append").save())

Options (all text, as Spark passes them; docs/spark.md has the table):

- `url` (required), `namespace`, `cluster`, and the Redis options of `spark_rows.REDIS_OPTIONS`.
- `type`, or `type_column`; `id`: the column of job ids (on a stream, `id_prefix` instead derives them).
- `payload`: the column whose value is the payload; default the row as a JSON object.
- every enqueue option of `options.OPTIONS` (but `job_id`) by its name, the same for every row, or
  `<option>_column` naming the column that gives each row's (a null: not given).
- `on_complete`, `on_success`: a batch's callbacks, JSON; `chunk`: jobs per round trip.

The executors import this module to run the writer, and need pyarrow (Spark's data sources hand rows over
in Arrow) besides redis-py.
"""

from __future__ import annotations

from jobcar import spark_compat  # noqa: F401 -- first: what the modules below use of 3.10 and 3.11, on 3.9

# isort: split

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from jobcar.enqueueing import ENQUEUE_CHUNK
from jobcar.errors import InvalidJob
from jobcar.keys import DEFAULT_NAMESPACE, DEFAULT_QUEUE
from jobcar.options import OPTIONS
from jobcar.records import JobSpec
from jobcar.spark_rows import (
    REDIS_OPTIONS,
    ROW_RESERVED,
    Connection,
    RowJobs,
    Sent,
    callback_spec,
    check_callbacks,
    read_option,
    redis_options,
    send,
)

__all__ = ["JobcarDataSource"]

#: The format's name: `df.write.format("jobcar")`.
FORMAT: Final = "jobcar"
#: Where the enqueue options' names are taken per row: `<option>_column`.
COLUMN_SUFFIX: Final = "_column"
#: The micro-batch's id inside a stream's batch name: `.option("batch", "orders-{epoch}")`.
EPOCH_FIELD: Final = "{epoch}"
#: The local property Spark sets on a micro-batch's tasks: the micro-batch id, on the executors too.
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"

_ROW_OPTIONS: Final = tuple(name for name in OPTIONS if name not in ROW_RESERVED)
_CONNECTION_KEYS: Final = frozenset({"url", "namespace", "cluster", *REDIS_OPTIONS})
_WRITE_KEYS: Final = frozenset(
    {"type", "type_column", "id", "id_prefix", "payload", "on_complete", "on_success", "chunk", *_ROW_OPTIONS}
    | {name + COLUMN_SUFFIX for name in _ROW_OPTIONS}
)
#: Options Spark itself passes on to a data source (keys arrive lowercased): not the format's to refuse.
SPARK_KEYS: Final = frozenset({"path", "checkpointlocation", "queryname"})
#: What `spark.read.format("jobcar")` takes (spark_read.py).
READ_KEYS: Final = frozenset({"queue", "batch", "state", "partition_size", "text_limit"})


def _flag(name: str, text: str | None) -> bool:
    if text is None:
        return False
    if text.strip().lower() not in ("true", "false"):
        raise InvalidJob(f"option {name} must be true or false, got {text!r}")
    return text.strip().lower() == "true"


def _positive(name: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise InvalidJob(f"option {name} must be a positive whole number, got {text!r}")
    return int(text)


def _refuse_unknown(options: Mapping[str, str], known: frozenset[str]) -> None:
    unknown = sorted(set(options) - known - SPARK_KEYS)
    if unknown:
        raise InvalidJob(f"the jobcar format has no option(s) {', '.join(unknown)}; see docs/spark.md")


def connection_of(options: Mapping[str, str]) -> Connection:
    url = options.get("url")
    if not url:
        raise InvalidJob(
            'the jobcar format needs the option url: the Redis URL, like .option("url", "redis://host:6379/0")'
        )
    return Connection(
        url=url,
        namespace=options.get("namespace", DEFAULT_NAMESPACE),
        cluster=_flag("cluster", options.get("cluster")),
        options=redis_options({k: v for k, v in options.items() if k in REDIS_OPTIONS}),
    )


@dataclass(frozen=True)
class WritePlan:
    """A write's options, read and checked once on the driver, pickled into every task."""

    connection: Connection
    rows: RowJobs
    chunk: int
    batch: str | None
    queue: str
    callbacks: Mapping[str, JobSpec | None] = field(default_factory=dict)

    @classmethod
    def of(cls, options: Mapping[str, str], schema: StructType, *, streaming: bool) -> WritePlan:
        _refuse_unknown(options, _CONNECTION_KEYS | _WRITE_KEYS)
        constants: dict[str, object] = {}
        columns: dict[str, str] = {}
        for name in _ROW_OPTIONS:
            if options.get(name) is not None:
                constants[name] = read_option(name, options[name])
            column = options.get(name + COLUMN_SUFFIX)
            if column is not None:
                columns[name] = column
        batch = constants.get("batch")
        if batch is not None and EPOCH_FIELD in str(batch) and not streaming:
            raise InvalidJob(f"batch: {EPOCH_FIELD} names a stream's micro-batch; a write has one batch")
        check_options = dict(constants)
        if batch is not None:
            check_options["batch"] = str(batch).replace(EPOCH_FIELD, "0")
        if options.get("id_prefix") is not None and not streaming:
            raise InvalidJob("id_prefix derives ids from a stream's micro-batches: a write takes its ids from id")
        rows = RowJobs(
            type=options.get("type"),
            type_column=options.get("type_column"),
            id_column=options.get("id"),
            id_prefix=options.get("id_prefix"),
            payload_column=options.get("payload"),
            options=check_options,
            columns=columns,
        )
        rows.check(schema.fieldNames())
        queue = str(constants.get("queue") or DEFAULT_QUEUE)
        callbacks = {kind: callback_spec(kind, options[kind]) if options.get(kind) else None
                     for kind in ("on_complete", "on_success")}  # fmt: skip
        check_callbacks(check_options.get("batch"), queue, callbacks)  # type: ignore[arg-type]
        if "queue" in columns and any(callbacks.values()):
            raise InvalidJob("on_complete and on_success seal one queue's batch: give queue, not queue_column")
        return cls(
            connection=connection_of(options),
            rows=replace(rows, options=constants),
            chunk=_positive("chunk", options.get("chunk"), ENQUEUE_CHUNK),
            batch=None if batch is None else str(batch),
            queue=queue,
            callbacks=callbacks,
        )

    def write(self, rows: Iterator[Any], epoch: str | None = None) -> Sent:
        """One partition: one client, its jobs in pipelined chunks (runs on an executor). With the environment
        variable JOBCAR_SPARK_PROFILE naming a directory, each partition is profiled (cProfile) into a file
        there, the rows' conversion by Spark included (bench/spark_profile.py --executors)."""
        directory = os.environ.get(PROFILE_ENV)
        if directory:
            return _profiled(directory, lambda: self._write(rows, epoch))
        return self._write(rows, epoch)

    def _write(self, rows: Iterator[Any], epoch: str | None) -> Sent:
        jobs = self.rows
        if epoch is not None and self.batch is not None and EPOCH_FIELD in self.batch:
            jobs = replace(jobs, options={**jobs.options, "batch": self.batch_of(epoch)})
        with self.connection.client() as client:
            return send(client, jobs.specs(rows, epoch), self.chunk)

    def batch_of(self, epoch: str | int) -> str | None:
        return None if self.batch is None else self.batch.replace(EPOCH_FIELD, str(epoch))

    def seal(self, epoch: str | int | None = None) -> None:
        """On the driver once Spark commits the write (or a micro-batch): the batch's callbacks wait for its
        last job from now on. Sealing again (a micro-batch replayed) changes nothing."""
        if not any(self.callbacks.values()):
            return
        batch = self.batch_of(epoch if epoch is not None else 0)
        assert batch is not None  # WritePlan.of requires a batch with callbacks
        with self.connection.client() as client:
            client.seal_batch(batch, queue=self.queue, **self.callbacks)


@dataclass
class JobcarCommitMessage(WriterCommitMessage):
    """What one task of a write enqueued (`Sent`'s counts), handed to the driver's commit."""

    partition: int
    attempt: int
    sent: Sent


#: A directory where each partition's write leaves its cProfile figures (`WritePlan.write`).
PROFILE_ENV: Final = "JOBCAR_SPARK_PROFILE"


def _profiled(directory: str, write: Callable[[], Sent]) -> Sent:
    import cProfile
    import uuid

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(write)
    finally:
        profiler.dump_stats(os.path.join(directory, f"partition-{os.getpid()}-{uuid.uuid4().hex[:8]}.prof"))


def _message(sent: Sent) -> JobcarCommitMessage:
    context = TaskContext.get()
    partition, attempt = (context.partitionId(), context.attemptNumber()) if context else (-1, 0)
    return JobcarCommitMessage(partition, attempt, sent)


class JobcarWriter(DataSourceWriter):
    """A batch write. Jobs are stored as each task sends them (Redis has no staging area): commit seals the
    batch (its callbacks then wait for its last job); a failed write's abort removes nothing, so the jobs
    its tasks stored stay and may run. Writing again with the same ids (and batch) completes it."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> JobcarCommitMessage:
        return _message(self.plan.write(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.plan.seal()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo by design: a job stored may already be running, so the jobs stay (docs/spark.md)."""


class JobcarStreamWriter(DataSourceStreamWriter):
    """A stream's micro-batches: each task's jobs get ids that a replay of the micro-batch (a restart from
    the checkpoint) gives again, so a replay adds nothing."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> JobcarCommitMessage:
        context = TaskContext.get()
        epoch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if epoch is None:
            raise RuntimeError(f"jobcar: no {BATCH_ID_PROPERTY} on this task: not a micro-batch stream")
        return _message(self.plan.write(iterator, epoch))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.plan.seal(batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is run again from the checkpoint: its rows' ids are the same then."""


class JobcarDataSource(DataSource):
    """`format("jobcar")`: register it once per session with `spark.dataSource.register(JobcarDataSource)`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from jobcar.spark_read import JOB_SCHEMA

        return JOB_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> JobcarWriter:
        return JobcarWriter(self._plan(schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> JobcarStreamWriter:
        return JobcarStreamWriter(self._plan(schema, overwrite, streaming=True))

    def reader(self, schema: StructType) -> DataSourceReader:
        from jobcar.spark_read import JobcarReader

        _refuse_unknown(self.options, _CONNECTION_KEYS | READ_KEYS)
        return JobcarReader(connection_of(self.options), self.options)

    def _plan(self, schema: StructType, overwrite: bool, *, streaming: bool) -> WritePlan:
        """Runs on the driver before any task: every option checked, and Redis asked (Connection.check)."""
        if overwrite:
            raise InvalidJob('the jobcar format only adds jobs: use .mode("append")')
        plan = WritePlan.of(self.options, schema, streaming=streaming)
        plan.connection.check()
        return plan
