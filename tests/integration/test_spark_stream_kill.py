"""The `jobcar` streaming sink killed with SIGKILL mid-stream, then started again from its checkpoint: the
whole Spark application (the driver's Python, its JVM, the Python workers) really dies wherever it happens
to be — between two micro-batches, while a partition writes, after a micro-batch's jobs were stored and
before Spark committed it — and the restart ends with every row enqueued exactly once, each micro-batch's
batch counting its own rows.

test_spark_stream.py replays one micro-batch from a checkpoint left as a kill would leave it; here the kill
is real and lands where it lands, which is what a user's `kill -9` or a lost node does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobcar import Client
from jobcar.keys import QueueKeys
from tests.integration.spark_streams import SCHEMA
from tests.integration.test_spark_stream import _job_ids, _write_file
from tests.servers import RedisServer, wait_for

FILES, ROWS_PER_FILE = 30, 40
ROWS = FILES * ROWS_PER_FILE
#: Killed once this many jobs are stored: a few micro-batches in, many more to come.
KILL_AFTER = 3 * ROWS_PER_FILE

#: The application: a file stream of one file per micro-batch into the jobcar sink, ids derived from the
#: micro-batch and the row (id_prefix), a batch per micro-batch. Runs until every file is written (availableNow).
APPLICATION = """
import json, sys
from pyspark.sql import SparkSession
from jobcar.spark_source import JobcarDataSource

source, checkpoint, url, namespace, schema = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2]").appName("jobcar-kill")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "512m").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(JobcarDataSource)
stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(source)
sink = (stream.writeStream.option("checkpointLocation", checkpoint).format("jobcar").option("url", url)
        .option("namespace", namespace).option("type", "order.ship").option("id_prefix", "orders")
        .option("batch", "orders-{epoch}"))
query = sink.trigger(availableNow=True).start()
query.awaitTermination()
print(json.dumps([p["batchId"] for p in query.recentProgress if p["numInputRows"]]))
"""


def _inputs(tmp_path: Path) -> Path:
    """FILES files of distinct rows, taken one per micro-batch in the order written."""
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        numbers = range(f * ROWS_PER_FILE, (f + 1) * ROWS_PER_FILE)
        rows = [{"n": n, "order_id": f"o-{n}", "item": "book"} for n in numbers]
        _write_file(source, f"{f:03d}.json", rows)
        os.utime(source / f"{f:03d}.json", (1_000_000 + f, 1_000_000 + f))  # modification order, whatever the clock
    return source


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The application in a process group of its own (the JVM and the Python workers join it)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", APPLICATION, *args], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(420)  # two Spark applications, each starting its own JVM: minutes on a loaded machine
def test_the_sink_killed_mid_stream_and_restarted_stores_every_row_once(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    source, checkpoint, log = _inputs(tmp_path), tmp_path / "checkpoint", tmp_path / "application.log"
    args = [str(source), str(checkpoint), redis_server.url, namespace, SCHEMA]
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        first = _start(args, log)
        try:
            wait_for(lambda: len(_job_ids(client)) >= KILL_AFTER or first.poll() is not None, timeout=180,
                     what=f"{KILL_AFTER} jobs stored by the stream")  # fmt: skip
            assert first.poll() is None, f"the application ended before the kill:\n{log.read_text()[-3000:]}"
            os.killpg(first.pid, signal.SIGKILL)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        wait_for(lambda: _group_gone(first.pid), timeout=30, what="the killed application's processes gone")
        stored_at_kill = len(_job_ids(client))
        assert stored_at_kill < ROWS, "the kill came after the stream had stored every row: it tested nothing"

        again = _start(args, log)
        try:
            assert again.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            if again.poll() is None:
                os.killpg(again.pid, signal.SIGKILL)

        ids = _job_ids(client)
        keys = QueueKeys.of(namespace, "default")
        assert len(ids) == len(set(ids)) == ROWS, f"{len(ids)} jobs ({len(set(ids))} ids) for {ROWS} rows"
        numbers = sorted(json.loads(client.redis.hget(keys.job(i), "payload") or b"{}")["n"] for i in ids)
        assert numbers == list(range(ROWS))  # every row once
        epochs = sorted({int(i.split(".")[1]) for i in ids})  # <prefix>.<micro-batch>.<digest>.<n>
        assert epochs == list(range(FILES))  # a file a micro-batch, none replayed under another number
        totals = [client.batch_status(f"orders-{epoch}").total for epoch in epochs]
        assert totals == [ROWS_PER_FILE] * FILES, f"batch totals by micro-batch: {totals}"
