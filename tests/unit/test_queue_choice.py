"""Weighted queue choice: each runnable queue is leased from in proportion to its weight."""

from __future__ import annotations

from collections import Counter

from jobcar.keys import QueueKeys
from jobcar.leasing import QueueState, pick


def queues(**weights: int) -> list[QueueState]:
    return [QueueState(QueueKeys.of("t", name), weight) for name, weight in weights.items()]


def test_weights_set_the_share_of_leases() -> None:
    candidates = queues(critical=6, default=3, low=1)
    picks = Counter(pick(candidates, strict_priority=False).keys.queue for _ in range(20_000))
    shares = {q: n / 20_000 for q, n in picks.items()}
    # 20,000 draws: one standard deviation is below 0.004; these bounds are over ten of them.
    assert abs(shares["critical"] - 0.6) < 0.05
    assert abs(shares["default"] - 0.3) < 0.05
    assert abs(shares["low"] - 0.1) < 0.05


def test_strict_priority_always_takes_the_first_runnable_queue() -> None:
    candidates = queues(critical=1, low=100)
    assert {pick(candidates, strict_priority=True).keys.queue for _ in range(100)} == {"critical"}
    assert pick(candidates[1:], strict_priority=True).keys.queue == "low"
