"""A scheduling round on the real server: every due step of every schedule in one round trip, so that a
backlog after a restart makes no other schedule late."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from jobcar.scripts import Reply, ScriptCall
from tests.integration.test_daemon_parts import MakeParts, Target, make_parts, target

__all__ = ["make_parts", "target"]  # the fixtures this module uses


async def test_a_round_fires_a_backlog_and_the_other_due_schedules_in_one_round_trip(
    target: Target, make_parts: MakeParts
) -> None:
    q = target.driver()
    parts = await make_parts(target)
    now_s = q.now_ms() / 1000
    producer = q.producer
    producer.upsert_schedule("backlog", type="t", every="1s", catchup="all", catchup_window="10m", start=now_s - 40)
    producer.upsert_schedule("steady", type="t", every="1s", catchup="none", start=now_s - 40)
    # Both wait at a tick from 30 s ago, as after a daemon was down: 30 ticks of `all` to fire, and one of
    # `none` (which then fires only when it alone is due: here it passes over its backlog).
    for name in ("backlog", "steady"):
        tick = int((now_s - 30) * 1000)
        q.redis.hset(q.keys.schedule(name), "next", tick)
        q.redis.zadd(q.keys.schedules, {name: tick})

    round_trips: list[int] = []
    scripts = parts.link.scripts

    def counted(calls: Sequence[ScriptCall], **options: Any) -> Awaitable[list[Reply]]:
        round_trips.append(len(calls))
        return scripts(calls, **options)

    parts.link.scripts = counted  # type: ignore[method-assign]
    await parts.runner.scheduler.round()

    assert len(round_trips) == 2, f"the due read and one pipeline of every step, not {round_trips}"
    backlog, steady = producer.schedule("backlog"), producer.schedule("steady")
    assert backlog is not None
    assert steady is not None
    assert 30 <= backlog.fires <= 31, "every tick of the backlog, in this one round"
    assert round_trips[1] >= backlog.fires, "every step in the one pipeline"
    assert (steady.fires, steady.skipped >= 30) == (0, True), "catchup none: a backlog is passed over, not fired"
    assert q.redis.llen(q.keys.pending) == backlog.fires + steady.fires
