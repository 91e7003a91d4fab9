"""jobcar.spark on real PySpark (local mode, one session for the module) against real Redis and a real daemon.

How the executors get jobcar: ONLY from the zip the test ships with `sparkContext.addPyFile`. The
executors' Python (PYSPARK_PYTHON, read when the SparkContext starts) is a wrapper that runs this
venv's interpreter through `EXECUTOR_BOOT`, which installs an import hook before Spark's worker code
runs and then runs the worker module (`-m pyspark.daemon`) as `python -m` would. The hook

- refuses aiohttp, yaml, uvloop and prometheus_client outright, as a machine without them would, and
- lets `jobcar` be found only in a `jobcar.zip` on sys.path (where Spark's worker puts the files of
  addPyFile), never through the venv's editable install of the package.

So a task that imports jobcar at all imports it from the shipped zip, with nothing but the standard
library and redis-py. The first test also reads back, from inside the executor, which file jobcar was
loaded from and which of the refused modules are loaded, and stores that in each job's payload.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark import SparkFiles, TaskContext, cloudpickle
from pyspark.sql import Row, SparkSession

import jobcar
from jobcar import Client, InvalidJob
from jobcar.client import AsyncClient, BatchStatus
from jobcar.keys import QueueKeys
from jobcar.spark import enqueue_dataframe
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, write_config
from tests.servers import RedisServer, wait_for

# The functions below run on the executors: pickle them by value (the executors cannot import this
# module, which needs pytest and the installed jobcar).
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

PACKAGE = Path(jobcar.__file__).parent
BLOCKED = ("aiohttp", "yaml", "uvloop", "prometheus_client")

EXECUTOR_BOOT = """
import importlib.machinery, os, runpy, sys

BLOCKED = {blocked!r}

class ZipOnly:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError("not installed on this executor: " + name)
        if name == "jobcar":
            shipped = [p for p in sys.path if os.path.basename(p) == "jobcar.zip"]
            spec = importlib.machinery.PathFinder.find_spec(name, shipped)
            if spec is None:
                raise ImportError("jobcar is importable here only from the zip shipped with addPyFile")
            return spec
        return None

sys.meta_path.insert(0, ZipOnly())
if sys.argv[1:2] == ["-m"]:
    module, sys.argv = sys.argv[2], [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def _package_zip(archive: Path) -> Path:
    """The package as test_client.py ships it: sources, Lua scripts (read as package resources), py.typed."""
    with zipfile.ZipFile(archive, "w") as zf:
        for f in PACKAGE.rglob("*"):
            if f.suffix in (".py", ".lua", ".typed"):
                zf.write(f, f"jobcar/{f.relative_to(PACKAGE)}")
    return archive


def zip_only_python(work: Path, python: str = sys.executable) -> Path:
    """The executors' interpreter (PYSPARK_PYTHON), written into `work`: `python` through EXECUTOR_BOOT, which
    imports jobcar only from a shipped jobcar.zip and refuses BLOCKED."""
    boot = work / "executor_boot.py"
    boot.write_text(EXECUTOR_BOOT.format(blocked=BLOCKED))
    wrapper = work / "executor-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{python}" "{boot}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


@contextlib.contextmanager
def spark_session(work: Path, **conf: str) -> Iterator[SparkSession]:
    """A local[2,4] session whose executors import jobcar only from the zip it ships (EXECUTOR_BOOT): one per
    test module (the JVM stays up between them, only the context restarts)."""
    wrapper = zip_only_python(work)
    saved_env, saved_path = os.environ.get("PYSPARK_PYTHON"), list(sys.path)
    os.environ["PYSPARK_PYTHON"] = str(wrapper)
    try:
        builder = (
            SparkSession.builder.master("local[2,4]")  # 2 threads; a task may fail 3 times and be retried
            .appName("jobcar-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "512m")
        )
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    finally:
        if saved_env is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = saved_env
    session.sparkContext.setLogLevel("ERROR")
    session.sparkContext.addPyFile(str(_package_zip(work / "jobcar.zip")))
    try:
        yield session
    finally:
        session.stop()
        sys.path[:] = saved_path  # addPyFile put the zip on the driver's path too


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    with spark_session(tmp_path_factory.mktemp("spark")) as session:
        yield session


def _provenance(row: Row) -> dict[str, Any]:
    """Runs on an executor, after jobcar.spark was imported there to unpickle the partition function."""
    return {
        "id": row["id"],
        "jobcar": sys.modules["jobcar"].__file__,
        "client": sys.modules["jobcar.client"].__file__,
        "root": SparkFiles.getRootDirectory(),
        "loaded": sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED),
        "pid": os.getpid(),
    }


def _payloads(client: redis.Redis, namespace: str, ids: list[str]) -> list[dict[str, Any]]:
    keys = QueueKeys.of(namespace, "default")
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "payload")
    return [json.loads(p) for p in pipe.execute()]


def _pending_ids(client: redis.Redis, namespace: str) -> list[str]:
    """The pending ids of every priority."""
    lists = QueueKeys.of(namespace, "default").pending_lists
    return [m.decode() for key in lists for m in client.lrange(key, 0, -1)]  # type: ignore[union-attr]


def test_executors_enqueue_with_jobcar_only_from_the_shipped_zip(
    spark: SparkSession, redis_server: RedisServer, r: redis.Redis, namespace: str
) -> None:
    rows = 300
    df = spark.range(rows, numPartitions=3)
    batch = enqueue_dataframe(
        df,
        type="spark.check",
        job_id=lambda row: f"row-{row['id']}",
        payload=_provenance,
        redis_url=redis_server.url,
        namespace=namespace,
        batch_size=64,
        options={"priority": 2, "expires_in": 3600},  # options the shipped zip's scripts must know
    )
    ids = _pending_ids(r, namespace)
    assert sorted(ids) == sorted(f"row-{n}" for n in range(rows))
    assert r.llen(QueueKeys.of(namespace, "default").pending_lists[2]) == rows
    payloads = _payloads(r, namespace, ids)
    for p in payloads:
        shipped = os.path.join(p["root"], "jobcar.zip") + os.sep
        assert p["jobcar"].startswith(shipped), p
        assert p["client"].startswith(shipped), p
        assert p["loaded"] == [], p
        assert p["pid"] != os.getpid()  # enqueued by a Python worker, not by the driver
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        status = client.batch_status(batch)
    assert (status.total, status.pending, status.finished) == (rows, rows, False)


FAIL_AT = 150  # index in its partition of the row whose payload fails the partition's first attempt


def _fail_first_attempt_midway(row: Row) -> dict[str, int]:
    attempt = TaskContext.get().attemptNumber()  # type: ignore[union-attr]  # always set inside a task
    if attempt == 0 and row["id"] % 200 == FAIL_AT:
        raise RuntimeError(f"injected: attempt 0 fails after enqueuing rows 0..{FAIL_AT - 1} of its partition")
    return {"id": row["id"], "attempt": attempt}


def test_a_task_retried_after_a_partial_enqueue_duplicates_no_job(
    spark: SparkSession, redis_server: RedisServer, r: redis.Redis, namespace: str
) -> None:
    """Each partition's first attempt sends 3 chunks of 50, then fails; the retry sends all 200 rows."""
    rows = 400
    df = spark.range(rows, numPartitions=2)  # ids 0..199 and 200..399
    batch = enqueue_dataframe(
        df,
        type="spark.retry",
        job_id=lambda row: f"row-{row['id']}",
        payload=_fail_first_attempt_midway,
        redis_url=redis_server.url,
        namespace=namespace,
        batch_id="retried",
        batch_size=50,
        options={"max_attempts": 5},
    )
    assert batch == "retried"
    ids = _pending_ids(r, namespace)
    assert len(ids) == len(set(ids)) == rows
    assert set(ids) == {f"row-{n}" for n in range(rows)}
    # What the failed first attempts stored stays as it was; the retries stored only the rest.
    attempts = {p["id"]: p["attempt"] for p in _payloads(r, namespace, ids)}
    assert attempts == {n: 0 if n % 200 < FAIL_AT else 1 for n in range(rows)}
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        status = client.batch_status(batch)
        job = client.get("row-7")
    assert (status.total, status.done, status.dead, status.canceled) == (rows, 0, 0, 0)
    assert job is not None
    assert job.max_attempts == 5


REJECTED_ROW = 137


def test_a_daemon_processes_the_batch_and_wait_batch_sees_it_end(
    spark: SparkSession, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    rows = 600

    def handle(req: Received) -> tuple[int, dict[str, str], bytes]:
        row = json.loads(req.body)
        return (422, {}, b"rejected") if row["id"] == REJECTED_ROW else (200, {}, b"ok")

    with handler_server() as handlers:
        url = handlers.url("/rows", handle)
        config = write_config(tmp_path, redis_server.url, namespace, {"spark.row": {"url": url}}, concurrency=32)
        daemon = DaemonProcess(config).start()
        try:
            started = time.monotonic()
            batch = enqueue_dataframe(
                spark.range(rows, numPartitions=4),
                type="spark.row",
                job_id="id",  # a column holding the business key
                redis_url=redis_server.url,
                namespace=namespace,
            )
            with Client.from_url(redis_server.url, namespace=namespace) as client:
                status = client.wait_batch(batch, timeout=60, poll=0.05)
            elapsed = time.monotonic() - started
        finally:
            daemon.stop()
    assert (status.total, status.done, status.dead, status.canceled) == (rows, rows - 1, 1, 0), status
    assert status.pending == 0
    assert status.finished
    assert len(handlers.requests_to("/rows")) == rows
    assert elapsed < 60


def _fail_first_attempt_at_3000(row: Row) -> dict[str, int]:
    if TaskContext.get().attemptNumber() == 0 and row["id"] % 5000 == 3000:  # type: ignore[union-attr]
        raise RuntimeError("injected: attempt 0 fails after enqueuing 3,000 rows of its partition")
    return {"id": row["id"]}


def test_on_complete_runs_once_after_the_last_rows_job_with_the_rows_counts(
    spark: SparkSession, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """10,000 rows, each partition's first attempt failing after 3,000 of its 5,000, run by a daemon
    (batched, a hundred rows a call) as they come: the callback is enqueued once, after the last row's
    job, counting each row once."""
    rows = 10_000
    finished: list[float] = []
    seen: list[int] = []

    def handle_rows(req: Received) -> tuple[int, dict[str, str], bytes]:
        """A batched handler (a hundred rows a call): row ids ending in 007 are refused for good."""
        answers = []
        for job in json.loads(req.body):
            row = job["payload"]["id"]
            seen.append(row)
            answers.append({"id": job["id"], "outcome": "fail" if row % 1000 == 7 else "done"})
        finished.append(time.monotonic())
        return 200, {"Content-Type": "application/json"}, json.dumps(answers).encode()

    with handler_server() as handlers:
        handler = {"spark.row": {"url": handlers.url("/rows", handle_rows), "batch": {"max_size": 100}},
                   "spark.done": {"url": handlers.url("/done", lambda req: (200, {}, b"ok"))}}  # fmt: skip
        # Results kept past the Spark job: a retried task finds the rows its failed attempt enqueued, even
        # those already done, and enqueues none of them again (enqueue_dataframe's dedup horizon).
        config = write_config(tmp_path, redis_server.url, namespace, handler, concurrency=200, result_ttl="1h")
        daemon = DaemonProcess(config).start()
        try:
            enqueue_dataframe(
                spark.range(rows, numPartitions=2),
                type="spark.row",
                job_id=lambda row: f"row-{row['id']}",
                payload=_fail_first_attempt_at_3000,
                redis_url=redis_server.url,
                namespace=namespace,
                batch_id="rows",
                batch_size=500,
                on_complete=("spark.done", {"report": "daily"}),
            )
            wait_for(lambda: handlers.requests_to("/done"), timeout=120, what=f"the callback ({daemon.log_tail()})")
        finally:
            daemon.stop()
    (callback,) = handlers.requests_to("/done")
    assert sorted(seen) == list(range(rows))
    assert callback.at > max(finished), "the callback started before the last row's job had ended"
    counts = {"queue": "default", "batch": "rows", "total": rows, "done": rows - 10, "dead": 10, "canceled": 0}
    assert json.loads(callback.body) == {"batch": counts, "data": {"report": "daily"}}


def test_enqueue_dataframe_checks_its_arguments_on_the_driver(spark: SparkSession, redis_server: RedisServer) -> None:
    df = spark.range(3)
    common: dict[str, Any] = {"type": "t", "redis_url": redis_server.url}
    with pytest.raises(InvalidJob, match="column 'order_id' is not in the DataFrame"):
        enqueue_dataframe(df, job_id="order_id", **common)
    with pytest.raises(InvalidJob, match="may not set batch, job_id"):
        enqueue_dataframe(df, job_id="id", options={"job_id": "x", "batch": "b"}, **common)
    with pytest.raises(InvalidJob, match="unknown enqueue option"):
        enqueue_dataframe(df, job_id="id", options={"retries": 3}, **common)
    with pytest.raises(InvalidJob, match="batch_size"):
        enqueue_dataframe(df, job_id="id", batch_size=0, **common)


async def test_wait_batch_times_out_naming_the_last_counters(redis_server: RedisServer, namespace: str) -> None:
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        client.enqueue_many([("t", n, {"batch": "b1", "job_id": f"j{n}"}) for n in range(3)])
        client.enqueue("t", 0, batch="b1", job_id="j0")  # EXISTS: counted once
        assert client.batch_status("b1") == BatchStatus("b1", "default", total=3)
        with pytest.raises(TimeoutError, match="total=3 done=0 dead=0 canceled=0 pending=3"):
            client.wait_batch("b1", timeout=0.1, poll=0.02)
        assert client.wait_batch("never-used", timeout=0).finished  # an unknown batch reads as zeros

    # The same on the async client.
    async with AsyncClient.from_url(redis_server.url, namespace=namespace) as async_client:
        assert (await async_client.batch_status("b1")).pending == 3
        with pytest.raises(TimeoutError, match="pending=3"):
            await async_client.wait_batch("b1", timeout=0.05, poll=0.01)


def test_redis_is_asked_from_the_driver_before_any_task(spark: SparkSession, namespace: str) -> None:
    """A refused port, and a server that accepts and never answers (with the socket timeout given to every
    client, the driver's included), fail on the driver with a clear error: no Spark job runs."""
    df = spark.range(3)
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    with pytest.raises(ConnectionError, match=r"does not answer from the Spark driver .*no task was started"):
        enqueue_dataframe(df, type="t", job_id="id", redis_url="redis://127.0.0.1:1/0", namespace=namespace)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens; the kernel accepts, nobody answers
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with pytest.raises(ConnectionError, match="Timeout"):
            enqueue_dataframe(df, type="t", job_id="id", redis_url=url, redis_options={"socket_timeout": "0.5"})
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before
    with pytest.raises(InvalidJob, match="unknown Redis option"):
        enqueue_dataframe(df, type="t", job_id="id", redis_url=url, redis_options={"timeout": 1})
