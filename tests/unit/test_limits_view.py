"""limits_view.rule_limit: what `jobcar limits` shows as each group's limit, from the rules the lease takes."""

from __future__ import annotations

import pytest

from jobcar.limits_view import LimitGroup, rule_limit

RULES = {
    "a": {"total": 5, "per_key": 2, "rate": [50, 1000], "burst": 5, "key_rate": [1, 500], "key": "key"},
    "held": {"hold": "key", "key": "meta.tenant"},
    "f": {"total": 10, "fair": True, "key": "key"},
}


@pytest.mark.parametrize(
    ("group", "shown"),
    [
        ("a", ("5", 0.0, 1)),
        ("a#acme", ("2", 0.0, 1)),
        ("@a", ("50/1000ms", 20.0, 5)),
        ("@a#acme", ("1/500ms", 500.0, 1)),
        ("@held#acme", ("429 hold", 0.0, 1)),
        ("@held", (None, 0.0, 1)),  # the 429 holds keys back, not the type
        ("gone", (None, 0.0, 1)),
        ("@gone#k", (None, 0.0, 1)),
        ("~f#acme", ("turns for 10", 0.0, 1)),
        ("~f#", ("turns for 10", 0.0, 1)),  # jobs without a key take their turns as one
        ("~a#acme", (None, 0.0, 1)),  # a no longer fair: the reaper's pass lets its turns go
    ],
)
def test_each_group_shows_the_limit_its_rule_gives(group: str, shown: tuple[str | None, float, int]) -> None:
    assert rule_limit(group, RULES) == shown


@pytest.mark.parametrize(("group", "kind"), [("a", "concurrency"), ("a#k", "concurrency"), ("@a", "rate"),
                                             ("~a#k", "turn")])  # fmt: skip
def test_each_group_has_its_kind(group: str, kind: str) -> None:
    assert LimitGroup("q", group, 0, 0, None, None).kind == kind
