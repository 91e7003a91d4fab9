"""Weighted queue choice: each runnable queue is leased from in proportion to its weight."""

from __future__ import annotations

from collections import Counter

import redis.asyncio

from jobcar.config_types import Config
from jobcar.runner import Runner


def make_runner(**config: object) -> Runner:
    # Clients are created, never connected: choosing a queue talks to no server.
    client = redis.asyncio.Redis()
    return Runner(Config(source="test", **config), client, client, {})  # type: ignore[arg-type]


def test_weights_set_the_share_of_leases() -> None:
    runner = make_runner(queues={"critical": 6, "default": 3, "low": 1})
    picks = Counter(runner._pick(runner.queues).keys.queue for _ in range(20_000))
    shares = {q: n / 20_000 for q, n in picks.items()}
    # 20,000 draws: one standard deviation is below 0.004; these bounds are over ten of them.
    assert abs(shares["critical"] - 0.6) < 0.05
    assert abs(shares["default"] - 0.3) < 0.05
    assert abs(shares["low"] - 0.1) < 0.05


def test_strict_priority_always_takes_the_first_runnable_queue() -> None:
    runner = make_runner(queues={"critical": 1, "low": 100}, strict_priority=True)
    assert {runner._pick(runner.queues).keys.queue for _ in range(100)} == {"critical"}
    assert runner._pick(runner.queues[1:]).keys.queue == "low"
