"""The order the client stores one call's jobs in (`dependencies.enqueue_order`): jobs waiting for others
of the call first, one stage per level, each dependency naming the jobs waiting for it."""

from __future__ import annotations

import pytest

from jobcar.dependencies import enqueue_order
from jobcar.errors import InvalidJob
from jobcar.records import build_records


def _order(*jobs: tuple[str, list[str]]) -> list[list[str]]:
    specs = [("t", None, {"job_id": job_id, **({"after": after} if after else {})}) for job_id, after in jobs]
    return [[r.id for r in stage] for stage in enqueue_order(build_records(specs, 1 << 20)).stages]


def test_waiting_jobs_are_stored_before_what_they_wait_for() -> None:
    # a diamond: d waits for b and c, which wait for a; e waits for a alone
    assert _order(("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]), ("e", ["a"])) == [
        ["d", "e"], ["b", "c"], ["a"],
    ]  # fmt: skip


def test_a_wide_fan_out_and_a_long_chain_take_as_many_stages_as_levels() -> None:
    fan_out = _order(("root", []), *((f"c{n}", ["root"]) for n in range(10_000)))
    assert [len(stage) for stage in fan_out] == [10_000, 1]
    chain = _order(*((f"s{n}", [f"s{n - 1}"] if n else []) for n in range(2_000)))
    assert chain == [[f"s{n}"] for n in reversed(range(2_000))]


def test_the_dependencies_name_their_waiting_jobs_and_earlier_jobs_are_registered_later() -> None:
    specs = [("t", None, {"job_id": "a"}), ("t", None, {"job_id": "b", "after": ["a", "elsewhere"]})]
    order = enqueue_order(build_records(specs, 1 << 20))
    (b,), (a,) = order.stages
    assert (a.id, a.dependents, b.id) == ("a", ("default/b",), "b")
    assert [(r.id, ref) for r, ref in order.later] == [("b", "default/elsewhere")]


def test_a_cycle_is_refused() -> None:
    with pytest.raises(InvalidJob, match="cycle"):
        _order(("a", ["c"]), ("b", ["a"]), ("c", ["b"]), ("d", ["a"]))
