"""docs/spark.md's `foreachBatch` recipe on a real PySpark 3.5 (local[2], Java 17, Python 3.11), against the
session's Redis: the same stream and replay as test_spark_stream.py's recipe test runs on 4.x.

PySpark 3.5 cannot be installed beside .venv's 4.x, so it has a venv of its own, .venv-spark35, which the
Makefile makes (`make pytest` makes it first): pyspark 3.5 and redis-py, no jobcar. Its Python runs
spark35_driver.py in a subprocess, whose driver and executors import jobcar from the zip that `python -m
jobcar.spark zip` builds (the executors only from the copy addPyFile ships them: test_spark.py's boot script);
this test drives it run by run, forgets the checkpoint's last commit between two runs, and reads the jobs
with jobcar.Client.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from jobcar import Client
from tests.integration.test_spark import zip_only_python
from tests.integration.test_spark_old_python import cli_zip
from tests.integration.test_spark_stream import _forget_last_commit, _inputs, _job_ids
from tests.servers import RedisServer, stop_process

ROOT = Path(__file__).resolve().parents[2]
SPARK35_VENV = ROOT / ".venv-spark35"
DRIVER = Path(__file__).with_name("spark35_driver.py")
ANSWER = "spark35-driver: "  # as spark35_driver.py starts its answers (it cannot be imported here: PySpark 3.5)
#: Upper bounds, not waits: a JVM and a session on a loaded 2-core machine; a run of two micro-batches.
STARTUP_TIMEOUT = 90.0
RUN_TIMEOUT = 60.0


def spark35_python() -> Path:
    """.venv-spark35's interpreter; a clear failure, never a skip, where the venv is missing."""
    python = SPARK35_VENV / "bin" / "python"
    if not os.access(python, os.X_OK):
        pytest.fail(f"{python} is missing: run `make .venv-spark35` (PySpark 3.5 in a venv of its own)")
    return python


class Driver:
    """spark35_driver.py in its process: its answers, one JSON value a line on stdout, read as they come."""

    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process, self.log = process, log
        self.answers: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            if line.startswith(ANSWER):
                self.answers.put(line.removeprefix(ANSWER))
        self.answers.put(None)  # the driver ended

    def answer(self, timeout: float) -> Any:
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no answer from the PySpark 3.5 driver within {timeout}s: {self.log_tail()}")
        if line is None:
            pytest.fail(f"the PySpark 3.5 driver ended (exit {self.process.wait()}): {self.log_tail()}")
        return json.loads(line)

    def run(self) -> list[tuple[int, int]]:
        """One run of the stream from its checkpoint to the end of its files: the (micro-batch, rows) it ran."""
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return [(batch, rows) for batch, rows in self.answer(RUN_TIMEOUT)]

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@contextmanager
def spark35_driver(work: Path, redis_url: str, namespace: str, source: Path, checkpoint: Path) -> Iterator[Driver]:
    """The driver with its session up; its stdin closed at the end (it stops the session and exits)."""
    python = spark35_python()
    archive = cli_zip(work)
    # Nothing of .venv's Spark 4 reaches it: its own pyspark finds its own Spark; executors through the boot script.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = str(zip_only_python(work, str(python)))
    log = work / "driver.log"
    args = [str(python), "-I", str(DRIVER), str(ROOT), str(archive), redis_url, namespace, str(source), str(checkpoint)]
    with log.open("w") as stderr, subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   stderr=stderr, text=True, env=env, cwd=work) as process:  # fmt: skip
        try:
            driver = Driver(process, log)
            yield driver
            assert process.stdin is not None
            process.stdin.close()
            assert process.wait(timeout=RUN_TIMEOUT) == 0, driver.log_tail()
        finally:
            stop_process(process)


@pytest.mark.timeout(300)  # a Spark 3.5 application of its own, its JVM started cold: minutes under load
def test_the_foreach_batch_recipe_on_pyspark_3_5_replayed_from_its_checkpoint_adds_nothing_twice(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    source, checkpoint = _inputs(tmp_path), tmp_path / "checkpoint"
    with spark35_driver(tmp_path, redis_server.url, namespace, source, checkpoint) as driver:
        hello = driver.answer(STARTUP_TIMEOUT)
        assert hello["pyspark"].startswith("3.5."), hello
        assert hello["spark"] == hello["pyspark"], hello  # the JVM's Spark is the same 3.5
        assert hello["jobcar"] == f"{tmp_path}/jobcar.zip/jobcar/__init__.py", hello
        for executor in hello["executors"]:
            assert executor["jobcar"].endswith("/jobcar.zip/jobcar/__init__.py"), executor  # addPyFile's copy
            assert executor["jobcar"] != hello["jobcar"], executor
            assert (executor["pyspark"], executor["python"]) == (hello["pyspark"], str(spark35_python())), executor
            assert executor["pid"] != driver.process.pid, executor

        assert driver.run() == [(0, 100), (1, 100)]
        with Client.from_url(redis_server.url, namespace=namespace) as client:
            first = _job_ids(client)
            assert first == sorted(f"o-{n}" for n in range(199))  # the equal rows share their order id: one job
            _forget_last_commit(checkpoint)
            assert driver.run() == [(1, 100)]  # micro-batch 1 again, whole
            assert _job_ids(client) == first
            assert (client.batch_status("orders-0").total, client.batch_status("orders-1").total) == (100, 99)
    assert (checkpoint / "commits" / "1").exists()
