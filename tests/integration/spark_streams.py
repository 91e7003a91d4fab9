"""A file stream run to its end, as the streaming tests run their sinks: on PySpark 4 in test_spark_stream.py and
on PySpark 3.5 in spark35_driver.py, which .venv-spark35's Python runs. So this module imports pyspark and
nothing else: no pytest, no jobcar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

#: The rows of test_spark_stream.py's input files, one JSON object a line.
SCHEMA = "n long, order_id string, item string"


def run_stream(spark: SparkSession, source: Path, checkpoint: Path, sink: Any) -> list[tuple[int, int]]:
    """Every file there, a micro-batch each (maxFilesPerTrigger 1), then stop (availableNow): waits for the query
    to end, not for a time. Returns the (micro-batch, rows) it ran."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    query = sink(stream.writeStream.option("checkpointLocation", str(checkpoint))).trigger(availableNow=True).start()
    query.awaitTermination()
    assert query.exception() is None
    return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
