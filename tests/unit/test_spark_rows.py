"""A row's payload as JSON (spark_rows.as_dict and jsonable): what pyspark's asDict(recursive=True) gave,
nested structs, arrays and maps included, without walking every plain value through it."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from pyspark.sql import Row

from jobcar.spark_rows import as_dict, jsonable


def test_a_row_with_nested_structs_arrays_and_maps_is_the_json_of_its_recursive_asdict() -> None:
    Item = Row("sku", "price")
    row = Row(
        id=7, name="a", ok=True, ratio=0.5, none=None, at=datetime(2026, 11, 28, 6, 0, tzinfo=UTC),
        day=date(2026, 11, 28), amount=Decimal("1.20"), raw=bytearray(b"xy"),
        address=Row(city="Lyon", geo=Row(lat=45.7, lon=4.8)), items=[Item("s1", 3), Item("s2", 4)],
        tags={"k": Row(v=1)}, plain=[1, "b", None],
    )  # fmt: skip
    got = jsonable(as_dict(row))
    assert got == jsonable(row.asDict(recursive=True))
    assert got["address"] == {"city": "Lyon", "geo": {"lat": 45.7, "lon": 4.8}}
    assert got["items"] == [{"sku": "s1", "price": 3}, {"sku": "s2", "price": 4}]
    assert (got["tags"], got["at"], got["amount"], got["raw"]) == (
        {"k": {"v": 1}}, "2026-11-28T06:00:00+00:00", "1.20", b"xy")  # fmt: skip


def test_a_mapping_is_read_as_it_is() -> None:
    assert as_dict({"a": 1}) == {"a": 1}
