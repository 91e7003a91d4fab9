"""The periodic loops on idle queues (ADR 0022), on the real server: an idle pass of the settler, the
scheduler and the reaper is one EXISTS for all the served queues, with no script and no per-queue read, and
the pass after something appeared still does its work (a schedule created elsewhere fires, an entry no wake
announced is carried, an expired lease is reaped, a limit group's safety net runs)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from jobcar.job import State
from jobcar.scripts import Reply, ScriptCall
from tests.integration.test_daemon_parts import MakeParts, Parts, Target, any_target, make_parts, target, until_expired

__all__ = ["any_target", "make_parts", "target"]  # the fixtures this module uses

QUEUES = {"a": 1, "b": 1, "c": 1}


@dataclass
class Sent:
    """What the parts sent through their link while counted: script calls per round trip, plain commands by
    name, and pipelines built."""

    scripts: list[int] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    pipelines: int = 0

    def clear(self) -> None:
        self.scripts.clear()
        self.commands.clear()
        self.pipelines = 0


def counted(parts: Parts) -> Sent:
    """Count what goes through the parts' real client and link (the calls themselves still run)."""
    sent = Sent()
    link, client = parts.link, parts.link.client
    assert isinstance(client, redis.asyncio.Redis), "counted on the standalone server (Cluster splits EXISTS)"
    scripts, execute_command, pipeline = link.scripts, client.execute_command, client.pipeline

    def count_scripts(calls: Sequence[ScriptCall], **options: Any) -> Awaitable[list[Reply]]:
        sent.scripts.append(len(calls))
        return scripts(calls, **options)

    def count_command(*args: Any, **options: Any) -> Awaitable[Any]:
        sent.commands.append(str(args[0]).upper())
        return execute_command(*args, **options)  # type: ignore[no-any-return]

    def count_pipeline(*args: Any, **options: Any) -> Any:
        sent.pipelines += 1
        return pipeline(*args, **options)

    link.scripts = count_scripts  # type: ignore[method-assign]
    client.execute_command = count_command  # type: ignore[method-assign]
    client.pipeline = count_pipeline  # type: ignore[method-assign]
    return sent


async def test_an_idle_pass_of_each_loop_is_one_exists_for_every_queue(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, queues=QUEUES)
    sent = counted(parts)

    await parts.runner.scheduler.round()
    assert sent.scripts == [3], "the first round reads every queue's schedules, in one round trip"
    sent.clear()
    await parts.runner.scheduler.round()
    assert (sent.scripts, sent.commands) == ([], ["EXISTS"]), "then one EXISTS while no queue has a schedule"

    sent.clear()
    await parts.runner.settler.step()  # the first pass is due at once
    assert (sent.scripts, sent.commands, sent.pipelines) == ([], ["EXISTS"], 0), "no settled list is read"

    sent.clear()
    assert await parts.reaper.reap(skip_idle=True) == {}
    assert (sent.scripts, sent.commands) == ([], ["EXISTS"]), "no reap script while nothing is leased or held"


async def test_a_schedule_created_after_idle_rounds_fires_at_the_next_round(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target, queues=QUEUES)
    scheduler = parts.runner.scheduler
    assert await scheduler.round() == 5.0, "no schedule: the longest sleep"
    await scheduler.round()  # an idle round: the EXISTS only
    q = any_target.driver("b")
    now_s = q.now_ms() / 1000
    q.producer.upsert_schedule("due", type="t", queue="b", every="1s", catchup="none", start=now_s - 10)
    tick = q.now_ms() - 1  # as if it waited at a tick that just passed
    q.redis.hset(q.keys.schedule("due"), "next", tick)
    q.redis.zadd(q.keys.schedules, {"due": tick})

    await scheduler.round()

    due = q.producer.schedule("due")
    assert due is not None
    assert due.fires == 1, "seen by the next round, as before any idle round"
    assert q.redis.llen(q.keys.pending) == 1
    # The ZSET's head alone tells the next round when "due" ticks again (schedules_due's short answer).
    assert 0 < await scheduler.round() <= 1.0 + 0.01


async def test_the_settlers_pass_after_idle_ones_carries_an_entry_no_wake_announced(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target, queues=QUEUES)
    a, c = any_target.driver("a"), any_target.driver("c")
    settler = parts.runner.settler
    await settler.step()  # idle: nothing to carry
    waiting = a.enqueue("t", after=[("c", c.enqueue("t").id)])
    leased = c.lease_one()
    assert c.ack(leased.job.id, leased.token) == 2  # acked by another daemon: this one's settler is not woken
    assert c.redis.exists(c.keys.settled)

    await settler.step()  # the next pass, PASS_INTERVAL after the last

    assert a.where(waiting.id) is State.PENDING
    assert not c.redis.exists(c.keys.settled)


async def test_the_reapers_pass_after_idle_ones_reaps_an_expired_lease_and_runs_the_limits_safety_net(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target, queues=QUEUES)
    q = any_target.driver("b")
    assert await parts.reaper.reap(skip_idle=True) == {}
    job_id = q.enqueue("t").id
    q.lease_one(lease_ms=1, max_attempts=3)
    await until_expired(q, job_id)

    reaped = await parts.reaper.reap(skip_idle=True)

    assert reaped["b"] == {job_id: "pending"}
    assert q.where(job_id) is State.PENDING
    # A limit group alone (no lease held) is still a pass with the script: its held jobs' safety net.
    q.redis.sadd(q.keys.limit_groups, "t")
    assert await parts.reaper.reap(skip_idle=True) == {"a": {}, "b": {}, "c": {}}
