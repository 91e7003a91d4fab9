"""Enqueue one job per row of a Spark DataFrame, from the executors, as one batch.

    from jobcar.spark import enqueue_dataframe
    spark.sparkContext.addPyFile("jobcar.zip")      # or have jobcar installed on the executors
    batch = enqueue_dataframe(orders, type="order.ship", job_id="order_id", redis_url=URL)
    Client.from_url(URL).wait_batch(batch, timeout=3600)

pyspark is not imported here (only for type checking): this module is shipped to the executors with
the rest of the package and runs there with nothing but the standard library and redis-py (on Python 3.9
and 3.10 too: spark_compat). The `jobcar` format of Spark 4 is in spark_source.py; docs/spark.md says how to use both.

    python -m jobcar.spark zip [jobcar.zip]      # the package as a zip for addPyFile / --py-files
"""

from __future__ import annotations

from jobcar import spark_compat  # noqa: F401 -- first: what the modules below use of 3.10 and 3.11, on 3.9

# isort: split

import argparse
import sys
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobcar import spark_rows
from jobcar.enqueueing import ENQUEUE_CHUNK
from jobcar.errors import InvalidJob
from jobcar.keys import DEFAULT_NAMESPACE, DEFAULT_QUEUE
from jobcar.names import ID_PATTERN, TYPE_PATTERN, check_name
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES, JobSpec, build_callbacks, build_record
from jobcar.spark_rows import Connection, as_dict, jsonable, send

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

__all__ = ["enqueue_dataframe"]

#: Options enqueue_dataframe sets itself, so `options` may not name them.
RESERVED_OPTIONS = frozenset({"job_id", "queue", "batch"})


def enqueue_dataframe(
    df: DataFrame,
    *,
    type: str,
    job_id: str | Callable[[Row], str],
    redis_url: str,
    payload: str | Callable[[Row], object] | None = None,
    queue: str = DEFAULT_QUEUE,
    namespace: str = DEFAULT_NAMESPACE,
    batch_id: str | None = None,
    batch_size: int = ENQUEUE_CHUNK,
    options: Mapping[str, object] | None = None,
    cluster: bool = False,
    on_complete: JobSpec | None = None,
    on_success: JobSpec | None = None,
    redis_options: Mapping[str, object] | None = None,
) -> str:
    """Enqueue a job of `type` for every row of `df` and return the batch id they all carry.

    The work runs on the executors (`df.foreachPartition`): each partition opens one `Client` on
    `redis_url`, sends its jobs with `enqueue_many` in chunks of `batch_size` (one pipelined round trip
    each) and closes the client. The executors must be able to import jobcar: install it there, or
    ship the package as a zip with `spark.sparkContext.addPyFile` (it needs only redis-py).

    - `payload`: None sends the whole row as a JSON object (datetimes and dates as ISO 8601 text,
      decimals as text); a column name sends that column's value (bytes as they are, anything else
      as JSON); a function of the Row returns the payload (bytes, or a JSON-serialisable value).
    - `job_id` (required): a column holding a business key, or a function of the Row returning one.
    - `options`: other enqueue options for every job (max_attempts, timeout, delay, meta, ...).
    - `batch_id`: default a new random id. Pass your own to be able to run the same call again.
    - `redis_options`: redis-py options for every executor's client (spark_rows.REDIS_OPTIONS: socket
      timeouts, default 60 s and 10 s to connect, so no task waits forever on a silent server; TLS files with
      a `rediss://` URL). Redis is asked from the driver first: a ConnectionError before any task starts.

    **Why job ids are required: Spark runs tasks more than once.** A failed task is retried, a slow
    one may be run twice at once (speculative execution), and a failed job may be rerun. A job id of
    the caller's choosing is add-if-absent, deduplicated for its *dedup horizon*: while its job exists
    (pending, scheduled, active or dead) and, after success, for as long as the daemon keeps results
    (`result_ttl`; without it, not at all). A task retry or speculative duplicate that enqueues an id
    within that horizon finds the job and writes nothing (status EXISTS), so no job is duplicated and
    a partition that failed half way is completed by its retry. After the horizon the same id
    enqueues (and runs) again: without `result_ttl`, a job that already succeeded is gone, so a late
    retry or speculative copy of its task would enqueue it anew. Give the daemon a `result_ttl` longer
    than the Spark job can run to close that gap. Ids are deduplicated per queue.

    The batch counters (`Client.batch_status`, `Client.wait_batch` with the same `queue`) count each
    job once, when it is stored: an EXISTS writes nothing and counts nothing, so after this returns,
    `total` is the number of distinct jobs the batch holds (an id enqueued again after its horizon
    is a new job and counts again).

    **Callbacks** (`on_complete`, `on_success`: (type, data) or (type, data, options), as for
    `Client.seal_batch`): once every partition has enqueued, the driver seals the batch, and the callback
    is enqueued once when the batch's last job ends, its payload carrying the batch's counts. A task
    retried after a partial enqueue counts each row once (the ids above), so the counts are the rows'.
    Seal only what is complete: the callbacks are enqueued only when this call returns.

    Raises InvalidJob on the driver for bad arguments, before any job is sent. If the Spark job fails
    (a task out of retries, a row whose payload is not JSON-serialisable...), the jobs already sent
    stay enqueued; call again with the same `batch_id` to complete the batch without duplicates.
    """
    check_name("job type", type, TYPE_PATTERN)
    check_name("namespace", namespace)
    batch_id = uuid.uuid4().hex if batch_id is None else check_name("batch id", batch_id, ID_PATTERN)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidJob(f"batch_size must be a positive integer, got {batch_size!r}")
    extra: dict[str, Any] = dict(options or {})
    clash = sorted(RESERVED_OPTIONS & set(extra))
    if clash:
        raise InvalidJob(f"options may not set {', '.join(clash)}: enqueue_dataframe sets them")
    # Validates queue, batch id, every option and the callbacks here, not once per row on the executors.
    build_record(type, None, DEFAULT_MAX_PAYLOAD_BYTES, job_id="check", queue=queue, batch=batch_id, **extra)
    callbacks = {"on_complete": on_complete, "on_success": on_success}
    build_callbacks(batch_id, queue, callbacks, DEFAULT_MAX_PAYLOAD_BYTES)
    columns = set(df.columns)
    for what, given in (("job_id", job_id), ("payload", payload)):
        if isinstance(given, str) and given not in columns:
            raise InvalidJob(f"{what} column {given!r} is not in the DataFrame (columns: {', '.join(df.columns)})")
        if not (isinstance(given, str) or callable(given) or (what == "payload" and given is None)):
            raise InvalidJob(f"{what} must be a column name or a function of the row, not {given!r}")

    connection = Connection(redis_url, namespace, cluster, spark_rows.redis_options(redis_options or {}))
    connection.check()
    writer = _PartitionWriter(
        type=type,
        job_id=job_id,
        payload=payload,
        options={**extra, "queue": queue, "batch": batch_id},
        connection=connection,
        batch_size=batch_size,
    )
    df.foreachPartition(writer)
    if on_complete is not None or on_success is not None:
        with connection.client() as client:
            client.seal_batch(batch_id, queue=queue, on_complete=on_complete, on_success=on_success)
    return batch_id


@dataclass(frozen=True)
class _PartitionWriter:
    """The function each partition runs on an executor (pickled by reference to this module)."""

    type: str
    job_id: str | Callable[[Row], str]
    payload: str | Callable[[Row], object] | None
    options: Mapping[str, object]
    connection: Connection
    batch_size: int

    def __call__(self, rows: Iterable[Row]) -> None:
        with self.connection.client() as client:
            send(client, map(self.spec, rows), self.batch_size)

    def spec(self, row: Row) -> JobSpec:
        if isinstance(self.job_id, str):
            key = row[self.job_id]
            if key is None:
                raise InvalidJob(f"row has no {self.job_id} (null), needed as its job id: {row!r}")
            job_id = key if isinstance(key, str) else str(key)
        else:
            job_id = self.job_id(row)
        if self.payload is None:
            body: object = jsonable(as_dict(row))
        elif isinstance(self.payload, str):
            body = jsonable(row[self.payload])
        else:
            body = self.payload(row)
        return (self.type, body, {**self.options, "job_id": job_id})


def build_zip(archive: Path) -> Path:
    """The installed package as a zip whose root is `jobcar/`: its modules, Lua scripts and py.typed, what a
    producer needs (not the dashboard's templates and files)."""
    package = Path(__file__).resolve().parent
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in sorted(package.rglob("*")):
            if f.suffix in (".py", ".lua", ".typed") and "__pycache__" not in f.parts:
                zf.write(f, f"jobcar/{f.relative_to(package).as_posix()}")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobcar.spark", description="jobcar's Spark helpers")
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("zip", help="build the zip of jobcar for addPyFile or spark-submit --py-files")
    made.add_argument("output", nargs="?", default="jobcar.zip", type=Path)
    args = parser.parse_args(argv)
    archive = build_zip(args.output)
    print(f"{archive}: jobcar for the executors (Python 3.9+, with redis-py; pyarrow for the jobcar format)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
