"""Spark enqueue throughput: the `jobcar` format (`df.write.format("jobcar")`), a stream's `foreachBatch` with
`enqueue_dataframe` (one micro-batch of every row) and `enqueue_dataframe` itself, in local[N], beside one
plain process's `Client.enqueue_many` of the same jobs (same payloads, caller-chosen ids, one batch), one
run each. Each kind of write runs once on a few rows first, so that its Python workers are up.

    .venv/bin/python bench/spark_enqueue.py [--rows 200000] [--cores 2] [--partitions 4]

Starts its own server (the test harness's choice of binary) and a local SparkSession; the session's
start-up is timed apart and not counted. The executors import jobcar from the zip the bench ships with
addPyFile (built by `python -m jobcar.spark zip`), as a cluster would. Each scenario writes into a fresh
namespace on the same server.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

import jobcar
from jobcar import Client
from jobcar.spark import build_zip, enqueue_dataframe


def tree_cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and every live descendant: (the Spark JVM's, the Python
    processes': this one and Spark's Python workers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, rest = (entry / "stat").read_text().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
    mine = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                changed = True
    java = sum(cpu[p][1] for p in mine if p in cpu and cpu[p][0] == "java")
    return java, sum(cpu[p][1] for p in mine if p in cpu) - java


def server_cpu(url: str) -> float:
    """The Redis server's CPU seconds so far (INFO cpu)."""
    with redis.Redis.from_url(url) as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


TYPE = "email.welcome"
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


#: Each scenario's CPU seconds: the Spark JVM's, the Python processes' (this one, the Spark workers), the
#: Redis server's.
CPU: dict[str, tuple[float, float, float]] = {}


def plain(url: str, rows: int) -> tuple[float, int]:
    namespace = f"p{uuid.uuid4().hex[:8]}"
    with Client.from_url(url, namespace=namespace) as client:
        cpu, server = time.process_time(), server_cpu(url)
        started = time.perf_counter()
        specs = [(TYPE, {"id": n, **PAYLOAD}, {"job_id": str(n), "batch": "bench"}) for n in range(rows)]
        client.enqueue_many(specs)
        elapsed = time.perf_counter() - started
        CPU["Client.enqueue_many, one process"] = (0.0, time.process_time() - cpu, server_cpu(url) - server)
        return elapsed, client.batch_status("bench").total


def spark_runs(url: str, rows: int, cores: int, partitions: int, tmp: Path) -> tuple[dict[str, float], float]:
    """Seconds of each Spark scenario, and the session's start-up (not counted)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    from jobcar.spark_source import JobcarDataSource

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("jobcar-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(str(build_zip(tmp / "jobcar.zip")))
    spark.dataSource.register(JobcarDataSource)
    df = spark.range(rows, numPartitions=partitions).select(
        "id", *(F.lit(value).alias(name) for name, value in PAYLOAD.items())
    )
    df.count()  # the JVM warmed up (range and literals start no Python worker: see the writes below)
    source = tmp / "rows"
    df.write.parquet(str(source))

    def with_format(namespace: str) -> None:
        (df.write.format("jobcar").option("url", url).option("namespace", namespace).option("type", TYPE)
           .option("id", "id").option("batch", "bench").mode("append").save())  # fmt: skip

    def with_function(namespace: str) -> None:
        enqueue_dataframe(df, type=TYPE, job_id="id", redis_url=url, namespace=namespace, batch_id="bench")

    def with_foreach_batch(namespace: str) -> None:
        def send(batch: DataFrame, epoch: int) -> None:
            enqueue_dataframe(batch, type=TYPE, job_id="id", redis_url=url, namespace=namespace, batch_id="bench")

        stream = spark.readStream.schema(df.schema).parquet(str(source)).repartition(partitions)
        checkpoint = str(tmp / f"checkpoint-{namespace}")
        query = stream.writeStream.foreachBatch(send).option("checkpointLocation", checkpoint)
        query.trigger(availableNow=True).start().awaitTermination()

    # The first write of each kind in a session starts its Python workers (a data source's plan, writer and
    # commit too): ~7 s for the format, ~2 s for enqueue_dataframe on 2 CPUs. A few rows of each first, so
    # that each figure below is the enqueue (docs/spark.md, where the time goes).
    warm = df.limit(40)
    (warm.write.format("jobcar").option("url", url).option("namespace", "warm").option("type", TYPE)
        .option("id", "id").option("batch", "warm").mode("append").save())  # fmt: skip
    enqueue_dataframe(warm, type=TYPE, job_id="id", redis_url=url, namespace="warm2", batch_id="warm")
    startup = time.perf_counter() - started

    seconds = {}
    try:
        for name, run in (
            (f'df.write.format("jobcar") local[{cores}]', with_format),
            (f"foreachBatch + enqueue_dataframe local[{cores}]", with_foreach_batch),
            (f"enqueue_dataframe local[{cores}]", with_function),
        ):
            namespace = f"s{uuid.uuid4().hex[:8]}"
            cpu, server = tree_cpu(), server_cpu(url)
            started = time.perf_counter()
            run(namespace)
            seconds[name] = time.perf_counter() - started
            (java, python), (java_before, python_before) = tree_cpu(), cpu
            CPU[name] = (java - java_before, python - python_before, server_cpu(url) - server)
            with Client.from_url(url, namespace=namespace) as client:
                total = client.batch_status("bench").total
            assert total == rows, (name, total)
    finally:
        spark.stop()
    return seconds, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cores", type=int, default=2, help="local[N] threads")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    binary = find_server_binary()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, Path(tmp) / "redis").start()
        try:
            with server.client() as client:
                version = client.info("server").get("redis_version")
            plain_s, plain_total = plain(server.url, args.rows)
            spark_s, startup = spark_runs(server.url, args.rows, args.cores, args.partitions, Path(tmp))
        finally:
            server.stop()
    assert plain_total == args.rows, plain_total

    import pyspark

    print(
        f"jobcar {jobcar.__version__}, redis-py {redis.__version__}, pyspark {pyspark.__version__}, "
        f"server {Path(binary).name} {version}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    title = f"scenario ({args.partitions} partitions)"
    print(f"{title:<48}{'rows':>9}{'seconds':>9}{'rows/s':>10}{'ratio':>7}{'JVM':>6}{'Python':>7}{'redis':>6}")
    for name, seconds in (*spark_s.items(), ("Client.enqueue_many, one process", plain_s)):
        java, python, server = CPU[name]
        print(f"{name:<48}{args.rows:>9}{seconds:>9.2f}{args.rows / seconds:>10,.0f}{plain_s / seconds:>7.2f}"
              f"{java:>6.1f}{python:>7.1f}{server:>6.1f}")  # fmt: skip
    print(
        f"ratio: to enqueue_many's rate (SparkSession start-up, not counted: {startup:.1f} s); JVM, Python, "
        "redis: CPU seconds of the Spark JVM, of the Python processes (this one, Spark's workers), of Redis"
    )


if __name__ == "__main__":
    main()
