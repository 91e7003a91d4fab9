"""The `jobcar` format of Spark 4's Python data sources (jobcar/spark_source.py, spark_read.py) on real local
PySpark, one session for the module, executors importing jobcar only from the shipped zip (test_spark.py's
`spark_session`), against the session's real Redis."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType

from jobcar import Client, State
from jobcar.options import OPTIONS
from jobcar.spark_rows import ROW_RESERVED
from jobcar.spark_source import COLUMN_SUFFIX, JobcarDataSource
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_spark import spark_session
from tests.servers import RedisServer

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    with spark_session(tmp_path_factory.mktemp("spark")) as session:
        session.dataSource.register(JobcarDataSource)
        yield session


def _writer(df: Any, url: str, namespace: str, **options: str) -> Any:
    writer = df.write.format("jobcar").option("url", url).option("namespace", namespace).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


ROWS_PER_PARTITION = 200
FAIL_AT = 150


def _fail_first_attempt(n: int) -> int:
    """A column whose value is the task's attempt: attempt 0 of each partition fails at its row FAIL_AT."""
    context = TaskContext.get()
    assert context is not None
    if context.attemptNumber() == 0 and n % ROWS_PER_PARTITION == FAIL_AT:
        raise RuntimeError("injected: attempt 0 fails part way")
    return context.attemptNumber()


def test_a_write_with_failing_tasks_stores_each_row_once_and_seals_the_batch_at_commit(
    spark: SparkSession, redis_server: RedisServer, namespace: str
) -> None:
    """Every task's first attempt fails part way (after sending what it had, if anything); the first 100 rows
    of each partition were stored before, as an earlier attempt would have left them. The write stores each
    row once: what was there stays as it was."""
    rows = 4 * ROWS_PER_PARTITION
    earlier = [n for n in range(rows) if n % ROWS_PER_PARTITION < 100]
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        client.enqueue_many([("order.ship", {"attempt": -1}, {"job_id": f"order-{n}", "batch": "orders"})
                             for n in earlier])  # fmt: skip
    attempt = F.udf(_fail_first_attempt, IntegerType(), useArrow=False)  # Arrow UDFs would need pandas
    df = (
        spark.range(rows, numPartitions=4)
        .withColumn("order_id", F.concat(F.lit("order-"), F.col("id").cast("string")))
        .withColumn("attempt", attempt(F.col("id")))
    )
    _writer(
        df, redis_server.url, namespace, type="order.ship", id="order_id", batch="orders", chunk="25",
        max_attempts="4", on_complete=json.dumps({"type": "orders.report", "data": {"day": "2026-11-28"}}),
    ).save()  # fmt: skip
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        status = client.batch_status("orders")
        jobs = [client.get(f"order-{n}", queue="default") for n in range(rows)]
        callback = client.get("orders.on_complete", queue="default")
    assert (status.total, status.pending) == (rows, rows)
    assert all(job is not None for job in jobs)
    attempts = [json.loads(job.payload)["attempt"] for job in jobs if job is not None]
    for part in range(4):
        mine = attempts[part * ROWS_PER_PARTITION : (part + 1) * ROWS_PER_PARTITION]
        assert mine[:100] == [-1] * 100  # found by every attempt, written by none
        assert set(mine[100:FAIL_AT]) <= {0, 1}  # the first attempt's, or else the retry's
        assert mine[FAIL_AT:] == [1] * (ROWS_PER_PARTITION - FAIL_AT)  # only the retry got there
    assert {job.max_attempts for job in jobs[100:FAIL_AT] if job is not None} == {4}
    # Sealed at the write's commit: the callback waits for the batch.
    assert callback is not None
    assert callback.state is State.WAITING


def test_every_enqueue_option_is_an_option_and_a_column(
    spark: SparkSession, redis_server: RedisServer, namespace: str
) -> None:
    """Each option of options.OPTIONS (but the id) is accepted as `.option(name)` and `<name>_column`; a
    sample of them, given both ways, reaches the stored jobs."""
    from jobcar.spark_source import WritePlan

    schema = spark.range(1).schema
    for name in OPTIONS:
        if name in ROW_RESERVED:
            continue
        with pytest.raises(Exception, match=f"{name}{COLUMN_SUFFIX} names column 'nope'"):
            WritePlan.of({"url": "redis://x", "type": "t", "id": "id", name + COLUMN_SUFFIX: "nope"}, schema,
                         streaming=False)  # fmt: skip
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    df = spark.createDataFrame(
        [("a", 3, at, {"tenant": "t1"}, "k1"), ("b", None, None, None, None)],
        "order_id string, prio int, at timestamp, tags map<string,string>, tenant string",
    )
    _writer(
        df, redis_server.url, namespace, type="order.ship", id="order_id", queue="spark", priority="7",
        priority_column="prio", run_at_column="at", meta_column="tags", key_column="tenant", max_attempts="2",
        timeout="30s", meta='{"source": "spark"}', expires_in="1h",
    ).save()  # fmt: skip
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        a, b = client.get("a", queue="spark"), client.get("b", queue="spark")
    assert a is not None
    assert b is not None
    assert (a.priority, a.state, a.run_at_ms, a.meta, a.limit_key) == (
        3, State.SCHEDULED, int(at.timestamp() * 1000), {"tenant": "t1"}, "k1")  # fmt: skip
    assert (b.priority, b.state, b.meta, b.limit_key) == (7, State.PENDING, {"source": "spark"}, None)
    assert (a.max_attempts, a.timeout_ms, b.timeout_ms) == (2, 30_000, 30_000)
    assert json.loads(a.payload) == {"order_id": "a"}  # the option columns are not in the payload
    assert b.expires_at_ms is not None


def test_the_driver_refuses_a_bad_write_before_any_task(
    spark: SparkSession, redis_server: RedisServer, namespace: str
) -> None:
    df = spark.range(3).withColumn("order_id", F.col("id").cast("string"))
    with pytest.raises(PySparkException, match="does not answer from the Spark driver"):
        _writer(df, "redis://127.0.0.1:1/0", namespace, type="t", id="order_id").save()
    with pytest.raises(PySparkException, match="give the jobs' ids"):
        _writer(df, redis_server.url, namespace, type="t").save()
    with pytest.raises(PySparkException, match="only adds jobs"):
        _writer(df, redis_server.url, namespace, type="t", id="order_id").mode("overwrite").save()
    with pytest.raises(PySparkException, match="has no option"):
        _writer(df, redis_server.url, namespace, type="t", id="order_id", retries="3").save()
    with pytest.raises(PySparkException, match="priority must be"):
        _writer(df, redis_server.url, namespace, type="t", id="order_id", priority="12").save()
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        assert client.get("0") is None


def test_a_write_run_again_after_its_jobs_finished_adds_nothing_within_keep_for(
    spark: SparkSession, namespace: str, redis_server: RedisServer, q: QueueDriver
) -> None:
    """A Spark task retried after a daemon with result_ttl 0 finished its jobs: the `keep_for` option keeps
    the ids, so the second write stores nothing and the batch counts each row once."""
    df = spark.range(6, numPartitions=2).withColumn("order_id", F.concat(F.lit("o-"), F.col("id").cast("string")))
    write = _writer(df, redis_server.url, namespace, type="t", id="order_id", batch="again", keep_for="2h")
    write.save()
    leased = q.lease().jobs
    assert len(leased) == 6
    assert all(j.job.keep_for_ms == 7_200_000 for j in leased)
    for j in leased:
        assert q.ack(j.job.id, j.token) == 1  # as a daemon with result_ttl 0 acks
    write.save()
    assert q.lease().jobs == []
    assert q.redis.hget(q.keys.batch("again"), "total") == b"6"
    assert {q.job(f"o-{n}").state for n in range(6)} == {State.DONE}  # type: ignore[union-attr]


def test_a_read_of_a_10000_job_batch_returns_every_outcome(
    spark: SparkSession, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """10,000 jobs written by the format, run by a daemon (batched, a hundred a call; ids ending in 007 fail
    for good), read back in five partitions: every job with its state, result or last error."""
    rows = 10_000

    def handle(req: Received) -> tuple[int, dict[str, str], bytes]:
        answers = []
        for job in json.loads(req.body):
            n = job["payload"]["n"]
            answers.append(
                {"id": job["id"], "outcome": "fail", "error": f"row {n} refused"}
                if n % 1000 == 7
                else {"id": job["id"], "outcome": "done", "result": {"double": 2 * n}}
            )
        return 200, {"Content-Type": "application/json"}, json.dumps(answers).encode()

    df = spark.range(rows, numPartitions=4).select(
        F.col("id").alias("n"), F.concat(F.lit("job-"), F.col("id").cast("string")).alias("job_id")
    )
    with handler_server() as handlers:
        handler = {"spark.read": {"url": handlers.url("/rows", handle), "batch": {"max_size": 100}}}
        config = write_config(tmp_path, redis_server.url, namespace, handler, concurrency=200, result_ttl="1h")
        daemon = DaemonProcess(config).start()
        try:
            _writer(df, redis_server.url, namespace, type="spark.read", id="job_id", batch="big",
                    max_attempts="1").save()  # fmt: skip
            with Client.from_url(redis_server.url, namespace=namespace) as client:
                status = client.wait_batch("big", timeout=120, poll=0.1)
        finally:
            daemon.stop()
    assert (status.total, status.done, status.dead) == (rows, rows - 10, 10)

    reader = spark.read.format("jobcar").option("url", redis_server.url).option("namespace", namespace)
    jobs = reader.option("batch", "big").option("partition_size", "2000").load()
    assert jobs.rdd.getNumPartitions() == 5
    got = {r["id"]: r for r in jobs.select("id", "state", "attempt", "result", "last_error", "finished_at").collect()}
    assert len(got) == rows
    for n in range(rows):
        row = got[f"job-{n}"]
        assert row["finished_at"] is not None
        if n % 1000 == 7:
            assert (row["state"], row["result"], row["last_error"]) == ("dead", None, f"row {n} refused")
        else:
            assert (row["state"], json.loads(row["result"]), row["last_error"]) == ("done", {"double": 2 * n}, None)

    dead = reader.option("state", "dead").load().select("id", "errors").collect()
    assert sorted(r["id"] for r in dead) == sorted(f"job-{n}" for n in range(rows) if n % 1000 == 7)
    assert all(r["errors"][0]["attempt"] == 1 for r in dead)
    # Past text_limit a result is binary only.
    small = reader.option("batch", "big").option("state", "done").option("text_limit", "13").load()
    sizes = small.select(F.col("result").isNull().alias("binary"), F.length("result_binary").alias("size"))
    assert {(r["binary"], r["size"] is not None and r["size"] > 13) for r in sizes.collect()} == {
        (False, False), (True, True)}  # fmt: skip
