"""Where a Spark executor's enqueue time goes: the `jobcar` format's partition work, in one process, on rows as
Spark hands them to a data source's writer (pyspark `Row`s of bench/spark_enqueue.py's DataFrame), beside
`Client.enqueue_many` of the same jobs built as plain tuples.

    .venv/bin/python bench/spark_profile.py [--rows 50000] [--profile]
    .venv/bin/python bench/spark_profile.py --executors 2 --rows 200000
    .venv/bin/python bench/spark_profile.py --first-writes --rows 200000

Starts its own server. Times, per phase and for the same rows: the rows' specs (`RowJobs.specs`: a row to
(type, payload, options)), the records (`build_records`: checks, JSON, the record), the pipelined sends
(`enqueue_many` of the specs, built again), the partition as the format runs it (`WritePlan.write`), and
plain `enqueue_many` of tuples built as bench/spark_enqueue.py builds them. `--profile` prints cProfile's
top functions of one `WritePlan.write`. `--executors CORES` profiles the format's partitions inside Spark's
Python workers instead (JOBCAR_SPARK_PROFILE), merged; `--first-writes` shows what a session's first write
of each kind costs against a warm one.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer, find_server_binary

from jobcar import Client
from jobcar.records import build_records

TYPE = "email.welcome"
PAYLOAD = {"user": 1234567, "template": "welcome", "locale": "en-GB", "campaign": "2026-autumn", "pad": "x" * 16}


def best(run: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--executors",
        type=int,
        metavar="CORES",
        default=0,
        help="profile the format's partitions on real local[CORES] executors instead",
    )
    parser.add_argument(
        "--first-writes",
        action="store_true",
        help="time and count the CPU of a session's first writes, then warm ones, on local[2]",
    )
    args = parser.parse_args()
    if args.executors:
        executors(args.rows, args.executors)
        return
    if args.first_writes:
        first_writes(args.rows)
        return
    from pyspark.sql import Row
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from jobcar.spark_source import WritePlan

    schema = StructType([StructField("id", LongType())] + [
        StructField(k, LongType() if isinstance(v, int) else StringType()) for k, v in PAYLOAD.items()])  # fmt: skip
    names = ["id", *PAYLOAD]
    RowOf = Row(*names)
    rows = [RowOf(n, *PAYLOAD.values()) for n in range(args.rows)]

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(find_server_binary(), Path(tmp) / "redis").start()
        try:

            def plan(namespace: str) -> WritePlan:
                options = {"url": server.url, "namespace": namespace, "type": TYPE, "id": "id", "batch": "bench"}
                return WritePlan.of(options, schema, streaming=False)

            probe = plan("probe")
            specs = list(probe.rows.specs(rows))
            figures = {
                "RowJobs.specs (row -> spec)": best(lambda: list(probe.rows.specs(rows))),
                "build_records (spec -> record)": best(lambda: build_records(specs, 1 << 20)),
            }

            def sends() -> None:
                with Client.from_url(server.url, namespace=f"e{uuid.uuid4().hex[:8]}") as client:
                    for start in range(0, len(specs), 500):
                        client.enqueue_many(specs[start : start + 500])

            def partition() -> None:
                plan(f"f{uuid.uuid4().hex[:8]}").write(iter(rows))

            def plain() -> None:
                with Client.from_url(server.url, namespace=f"p{uuid.uuid4().hex[:8]}") as client:
                    tuples = [(TYPE, {"id": n, **PAYLOAD}, {"job_id": str(n), "batch": "bench"})
                              for n in range(args.rows)]  # fmt: skip
                    client.enqueue_many(tuples)

            figures["enqueue_many of the specs, 500 a call"] = best(sends)
            figures["WritePlan.write (the format's partition)"] = best(partition)
            figures["Client.enqueue_many of tuples, one call"] = best(plain)
            print(f"{args.rows:,} rows, best of 3, {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}")
            for name, seconds in figures.items():
                print(f"{name:45} {seconds:7.3f} s {args.rows / seconds:>10,.0f} rows/s")
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                partition()
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
        finally:
            server.stop()


def executors(rows: int, cores: int) -> None:
    """A write of `rows` rows with the format on local[cores], 2 partitions a core, every partition profiled
    on its executor (JOBCAR_SPARK_PROFILE); the partitions' figures merged."""
    with tempfile.TemporaryDirectory() as tmp:
        profiles = Path(tmp) / "profiles"
        profiles.mkdir()
        server = RedisServer(find_server_binary(), Path(tmp) / "redis").start()
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # The Python workers inherit the environment of the JVM, started with the session.
        os.environ["JOBCAR_SPARK_PROFILE"] = str(profiles)
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from jobcar.spark import build_zip
        from jobcar.spark_source import JobcarDataSource

        spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
        try:
            spark.sparkContext.setLogLevel("ERROR")
            spark.sparkContext.addPyFile(str(build_zip(Path(tmp) / "jobcar.zip")))
            spark.dataSource.register(JobcarDataSource)
            df = spark.range(rows, numPartitions=2 * cores).select(
                "id", *(F.lit(value).alias(name) for name, value in PAYLOAD.items())
            )

            def write(namespace: str) -> float:
                started = time.perf_counter()
                (df.write.format("jobcar").option("url", server.url).option("namespace", namespace)
                   .option("type", TYPE).option("id", "id").option("batch", "bench").mode("append").save())  # fmt: skip
                return time.perf_counter() - started

            write("warm")  # the data source's Python workers started; its profiles are dropped
            for old in profiles.iterdir():
                old.unlink()
            seconds = write("profiled")
            files = sorted(str(p) for p in profiles.iterdir())
            print(
                f"{rows:,} rows, local[{cores}], {2 * cores} partitions: {seconds:.2f} s profiled, "
                f"{len(files)} partition profiles; load {os.getloadavg()[0]:.2f}"
            )
            if files:
                stats = pstats.Stats(*files)
                stats.sort_stats("cumulative").print_stats(25)
                stats.sort_stats("tottime").print_stats(20)
        finally:
            spark.stop()
            server.stop()


def first_writes(rows: int) -> None:
    """The format and enqueue_dataframe in one local[2] session, 4 partitions: 40 rows three times each (the
    first starts the Python workers), then `rows` rows; wall time and the CPU seconds of the JVM and of the
    Python processes (bench/spark_enqueue.py's tree_cpu)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from spark_enqueue import tree_cpu  # bench/spark_enqueue.py

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from jobcar.spark import build_zip, enqueue_dataframe
    from jobcar.spark_source import JobcarDataSource

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(find_server_binary(), Path(tmp) / "redis").start()
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
        try:
            spark.sparkContext.setLogLevel("ERROR")
            spark.sparkContext.addPyFile(str(build_zip(Path(tmp) / "jobcar.zip")))
            spark.dataSource.register(JobcarDataSource)
            for count in (40, 40, 40, rows):
                df = spark.range(count, numPartitions=4).select(
                    "id", *(F.lit(value).alias(name) for name, value in PAYLOAD.items())
                )
                for name in ("format", "enqueue_dataframe"):
                    namespace = uuid.uuid4().hex[:8]
                    (java, python), started = tree_cpu(), time.perf_counter()
                    if name == "format":
                        writer = df.write.format("jobcar").option("url", server.url).option("namespace", namespace)
                        writer.option("type", TYPE).option("id", "id").option("batch", "b").mode("append").save()
                    else:
                        enqueue_dataframe(df, type=TYPE, job_id="id", redis_url=server.url, namespace=namespace,
                                          batch_id="b")  # fmt: skip
                    (java_after, python_after), wall = tree_cpu(), time.perf_counter() - started
                    print(
                        f"{count:>7} rows {name:18} {wall:6.2f} s wall  JVM {java_after - java:5.2f} s  "
                        f"Python {python_after - python:5.2f} s",
                        flush=True,
                    )
            print(f"load {os.getloadavg()[0]:.2f}")
        finally:
            spark.stop()
            server.stop()


if __name__ == "__main__":
    main()
