"""The Spark driver of test_spark35.py, run by .venv-spark35's Python (PySpark 3.5 and redis-py, no jobcar
installed): docs/spark.md's `foreachBatch` recipe on a file stream, with jobcar imported from the zip that
`python -m jobcar.spark zip` builds, on the driver and (shipped with addPyFile) on the executors.

    python spark35_driver.py ROOT JOBCAR_ZIP REDIS_URL NAMESPACE SOURCE CHECKPOINT

ROOT is the work tree (for tests.integration.spark_streams). PYSPARK_PYTHON is the executors' interpreter.
Once its session is up, the driver answers with one line on stdout: the versions of PySpark and of Spark, and
where jobcar came from on the driver and on the executors. Then, for each line `run` on stdin, it runs the
stream from CHECKPOINT to the end of SOURCE's files and answers with the (micro-batch, rows) it ran. It stops
its session and exits when stdin ends. Its answers start with ANSWER; Spark's logs go to stderr.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ANSWER = "spark35-driver: "


def _where(_: object) -> dict[str, Any]:
    """Runs on an executor (pickled by value from __main__): where its jobcar, pyspark and Python are."""
    import pyspark

    importlib.import_module("jobcar.spark")  # through the executors' boot script: from the shipped zip only
    return {
        "jobcar": sys.modules["jobcar"].__file__,
        "pyspark": pyspark.__version__,
        "python": sys.executable,
        "pid": os.getpid(),
    }


def _answer(value: object) -> None:
    print(ANSWER + json.dumps(value), flush=True)


def main(root: str, archive: str, url: str, namespace: str, source: str, checkpoint: str) -> None:
    sys.path[:0] = [archive, root]  # jobcar from the zip only (nothing else has it here), the tests' helpers
    import pyspark
    from pyspark.sql import DataFrame, SparkSession

    from jobcar.spark import enqueue_dataframe
    from tests.integration.spark_streams import run_stream

    assert pyspark.__version__.startswith("3.5."), f"this is PySpark {pyspark.__version__}, not 3.5"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("jobcar-spark35")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.addPyFile(archive)
    executors = spark.sparkContext.parallelize(range(2), 2).map(_where).collect()
    _answer({"pyspark": pyspark.__version__, "spark": spark.version, "python": list(sys.version_info[:3]),
             "jobcar": sys.modules["jobcar"].__file__, "executors": executors})  # fmt: skip

    def send(df: DataFrame, epoch_id: int) -> None:  # the recipe, as docs/spark.md has it
        enqueue_dataframe(df, type="order.ship", job_id="order_id", redis_url=url, namespace=namespace,
                          batch_id=f"orders-{epoch_id}")  # fmt: skip

    try:
        for line in sys.stdin:
            assert line.strip() == "run", line
            _answer(run_stream(spark, Path(source), Path(checkpoint), lambda writer: writer.foreachBatch(send)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
