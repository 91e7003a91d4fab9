"""JOBCAR_SPARK_PROFILE: a partition's write profiled into a file of the directory it names (docs/spark.md,
where the time goes), its jobs sent as without it."""

from __future__ import annotations

import pstats
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StructField, StructType

from jobcar import Client
from jobcar.spark_source import PROFILE_ENV, WritePlan
from tests.servers import RedisServer


def test_a_partition_leaves_its_profile_where_the_variable_says(
    redis_server: RedisServer, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = StructType([StructField("id", LongType())])
    plan = WritePlan.of({"url": redis_server.url, "namespace": namespace, "type": "t", "id": "id"}, schema,
                        streaming=False)  # fmt: skip
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path))
    sent = plan.write(iter([Row(id=n) for n in range(3)]))
    assert (sent.rows, sent.created) == (3, 3)
    [profile] = tmp_path.glob("partition-*.prof")
    assert any(name == "_write" for _, _, name in pstats.Stats(str(profile)).stats)  # type: ignore[attr-defined]
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        assert client.get("2") is not None
