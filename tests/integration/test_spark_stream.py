"""Structured Streaming into jobcar on real local PySpark: the `jobcar` sink (`df.writeStream.format("jobcar")`)
and the `foreachBatch` recipe with `enqueue_dataframe` (docs/spark.md), each restarted from its checkpoint
after a micro-batch whose jobs were stored but whose commit was not (what a kill between the two leaves):
the replayed micro-batch adds no job twice."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from jobcar import Client
from jobcar.keys import QueueKeys
from jobcar.spark import enqueue_dataframe
from jobcar.spark_source import JobcarDataSource
from tests.integration.spark_streams import run_stream
from tests.integration.test_spark import spark_session
from tests.servers import RedisServer


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    with spark_session(tmp_path_factory.mktemp("spark")) as session:
        session.dataSource.register(JobcarDataSource)
        yield session


def _write_file(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """Atomically, as a file source wants its files: written aside, then renamed into the directory."""
    aside = directory.parent / f".{name}"
    aside.write_text("".join(json.dumps(r) + "\n" for r in rows))
    aside.rename(directory / name)


def _inputs(tmp_path: Path) -> Path:
    """Two files, each a micro-batch (maxFilesPerTrigger 1); the second holds two equal rows."""
    source = tmp_path / "in"
    source.mkdir()
    _write_file(source, "0.json", [{"n": n, "order_id": f"o-{n}", "item": "book"} for n in range(100)])
    second = [{"n": n, "order_id": f"o-{n}", "item": "pen"} for n in range(100, 199)]
    _write_file(source, "1.json", [*second, second[-1]])
    # A file source takes files in modification order: the second one later, whatever the clock's grain.
    first_mtime = (source / "0.json").stat().st_mtime
    os.utime(source / "1.json", (first_mtime + 10, first_mtime + 10))
    return source


def _forget_last_commit(checkpoint: Path) -> None:
    """What a kill after the sink stored micro-batch 1 and before Spark recorded it leaves: its offsets logged,
    its commit not. The restart runs micro-batch 1 again, on the same input."""
    (checkpoint / "commits" / "1").unlink()
    for crc in (checkpoint / "commits").glob(".1.crc"):
        crc.unlink()
    assert (checkpoint / "offsets" / "1").exists()


def _job_ids(client: Client) -> list[str]:
    keys = QueueKeys.of(client.namespace, "default")
    return sorted(m.decode() for key in keys.pending_lists for m in client.redis.lrange(key, 0, -1))


def test_the_jobcar_sink_replayed_from_its_checkpoint_adds_nothing_twice(
    spark: SparkSession, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """Ids derived from the micro-batch and the row (id_prefix): a replay gives each row the same id."""
    source, checkpoint = _inputs(tmp_path), tmp_path / "checkpoint"

    def sink(writer: Any) -> Any:
        jobcar = writer.format("jobcar").option("url", redis_server.url).option("namespace", namespace)
        return jobcar.option("type", "order.ship").option("id_prefix", "orders").option("batch", "orders-{epoch}")

    assert run_stream(spark, source, checkpoint, sink) == [(0, 100), (1, 100)]
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        first = _job_ids(client)
        assert len(first) == 200  # the two equal rows are two jobs
        _forget_last_commit(checkpoint)
        assert run_stream(spark, source, checkpoint, sink) == [(1, 100)]  # micro-batch 1 again, whole
        assert _job_ids(client) == first
        assert (client.batch_status("orders-0").total, client.batch_status("orders-1").total) == (100, 100)
        assert {i.split(".")[1] for i in first} == {"0", "1"}  # <prefix>.<micro-batch>.<digest>.<n>
    assert (checkpoint / "commits" / "1").exists()


def test_the_foreach_batch_recipe_replayed_from_its_checkpoint_adds_nothing_twice(
    spark: SparkSession, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """docs/spark.md's recipe for Spark 3.5 and 4: ids from the data, one batch per micro-batch."""
    source, checkpoint = _inputs(tmp_path), tmp_path / "checkpoint"
    url = redis_server.url

    def send(df: DataFrame, epoch: int) -> None:
        enqueue_dataframe(df, type="order.ship", job_id="order_id", redis_url=url, namespace=namespace,
                          batch_id=f"orders-{epoch}")  # fmt: skip

    assert run_stream(spark, source, checkpoint, lambda writer: writer.foreachBatch(send)) == [(0, 100), (1, 100)]
    with Client.from_url(url, namespace=namespace) as client:
        first = _job_ids(client)
        assert first == sorted(f"o-{n}" for n in range(199))  # the equal rows share their order id: one job
        _forget_last_commit(checkpoint)
        assert run_stream(spark, source, checkpoint, lambda writer: writer.foreachBatch(send)) == [(1, 100)]
        assert _job_ids(client) == first
        assert (client.batch_status("orders-0").total, client.batch_status("orders-1").total) == (100, 99)
