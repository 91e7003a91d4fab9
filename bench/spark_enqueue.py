"""Spark enqueue throughput: `jobcar.spark.enqueue_dataframe` in local[N] beside one plain process's
`Client.enqueue_many` of the same jobs (same payloads, caller-chosen ids, one batch), one run each.

    .venv/bin/python bench/spark_enqueue.py [--rows 200000] [--cores 2] [--partitions 4]

Starts its own server (the test harness's choice of binary) and a local SparkSession; the session's
start-up is timed apart and not counted. The executors import jobcar from the zip the bench ships with
addPyFile, as a cluster would. Each scenario writes into a fresh namespace on the same server.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

import jobcar
from jobcar import Client
from jobcar.spark import enqueue_dataframe

TYPE = "email.welcome"
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


def package_zip(archive: Path) -> Path:
    package = Path(jobcar.__file__).parent
    with zipfile.ZipFile(archive, "w") as zf:
        for f in package.rglob("*"):
            if f.suffix in (".py", ".lua", ".typed"):
                zf.write(f, f"jobcar/{f.relative_to(package)}")
    return archive


def plain(url: str, rows: int) -> tuple[float, int]:
    namespace = f"p{uuid.uuid4().hex[:8]}"
    with Client.from_url(url, namespace=namespace) as client:
        started = time.perf_counter()
        specs = [(TYPE, {"id": n, **PAYLOAD}, {"job_id": str(n), "batch": "bench"}) for n in range(rows)]
        client.enqueue_many(specs)
        elapsed = time.perf_counter() - started
        return elapsed, client.batch_status("bench").total


def spark_run(url: str, rows: int, cores: int, partitions: int, tmp: Path) -> tuple[float, int, float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

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
    spark.sparkContext.addPyFile(str(package_zip(tmp / "jobcar.zip")))
    df = spark.range(rows, numPartitions=partitions).select(
        "id", *(F.lit(value).alias(name) for name, value in PAYLOAD.items())
    )
    df.count()  # warm the Python workers up, so the timing below is the enqueue
    startup = time.perf_counter() - started
    namespace = f"s{uuid.uuid4().hex[:8]}"
    try:
        started = time.perf_counter()
        batch = enqueue_dataframe(df, type=TYPE, job_id="id", redis_url=url, namespace=namespace)
        elapsed = time.perf_counter() - started
    finally:
        spark.stop()
    with Client.from_url(url, namespace=namespace) as client:
        return elapsed, client.batch_status(batch).total, startup


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
            spark_s, spark_total, startup = spark_run(server.url, args.rows, args.cores, args.partitions, Path(tmp))
        finally:
            server.stop()
    assert plain_total == spark_total == args.rows, (plain_total, spark_total)

    import pyspark

    print(
        f"jobcar {jobcar.__version__}, redis-py {redis.__version__}, pyspark {pyspark.__version__}, "
        f"server {Path(binary).name} {version}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"{'scenario':<44}{'rows':>9}{'seconds':>9}{'rows/s':>10}")
    spark_name = f"enqueue_dataframe local[{args.cores}], {args.partitions} partitions"
    for name, seconds in ((spark_name, spark_s), ("Client.enqueue_many, one process", plain_s)):
        print(f"{name:<44}{args.rows:>9}{seconds:>9.2f}{args.rows / seconds:>10,.0f}")
    print(f"ratio spark/plain: {plain_s / spark_s:.2f}  (SparkSession start-up, not counted: {startup:.1f} s)")


if __name__ == "__main__":
    main()
