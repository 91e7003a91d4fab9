"""The periodic loops on idle queues (ADR 0022), on the real server: an idle pass of the settler, the
scheduler and the reaper is one EXISTS for all the served queues, with no script and no per-queue read, and
the pass after something appeared still does its work (a schedule created elsewhere fires, an entry no wake
announced is carried, an expired lease is reaped, a limit group's safety net runs). The lease an idle
watcher sends every IDLE_WAIT_MAX runs TIME and one EXISTS, and checks a key's type only before it writes."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from jobcar.job import State
from jobcar.scripts import Reply, ScriptCall, script
from jobcar.transitions import LeaseResult, cancel_call, lease_call, parse_lease
from tests.integration.driver import QueueDriver
from tests.integration.test_daemon_parts import (
    PATIENCE,
    MakeParts,
    Parts,
    Target,
    any_target,
    make_parts,
    target,
    until_expired,
)
from tests.servers import RedisServer

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
    # catchup latest: on a loaded machine the round may come more than a tick late, and it must still fire one.
    q.producer.upsert_schedule("due", type="t", queue="b", every="1s", catchup="latest", start=now_s - 10)
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
    settler.pass_interval = 0.2  # what the pass does, not how long it waits (PASS_INTERVAL, 5 s)
    await settler.step()  # idle: nothing to carry
    waiting = a.enqueue("t", after=[("c", c.enqueue("t").id)])
    leased = c.lease_one()
    assert c.ack(leased.job.id, leased.token) == 2  # acked by another daemon: this one's settler is not woken
    assert c.redis.exists(c.keys.settled)

    await settler.step()  # the next pass, PASS_INTERVAL after the last

    assert a.where(waiting.id) is State.PENDING
    assert not c.redis.exists(c.keys.settled)


async def test_an_entry_another_process_left_is_carried_at_the_wake_its_script_sent(
    any_target: Target, make_parts: MakeParts
) -> None:
    """A cancel from outside the daemon (a CLI's) leaves its entry and wakes the queue with a settled wake: the
    watcher blocked on the wake tells the settler, which carries the entry without waiting for a pass. A job's
    wake tells the settler nothing."""
    parts = await make_parts(any_target, queues=QUEUES)
    a, c = any_target.driver("a"), any_target.driver("c")
    settler = parts.runner.settler
    settler.pass_interval = 3600.0  # no pass comes during the test: only the wake can carry the entry
    await settler.step()  # the first pass, at once
    told: list[str] = []

    def settled(queue: str) -> None:  # what the runner wires, seen on its way
        told.append(queue)
        settler.wake(queue)

    parts.leaser.on_settled = settled
    queue = parts.queue("c")

    async def watched(woken_by: Callable[[], object]) -> None:
        """One wait of c's watcher, with c idle (nothing pending, its wake consumed), ended by `woken_by`."""
        c.redis.delete(c.keys.wake)
        queue.went_idle.set()
        watcher = asyncio.create_task(parts.leaser.watch(queue))
        woken_by()
        await asyncio.wait_for(watcher, PATIENCE)

    await watched(lambda: c.enqueue("t"))
    assert told == [], "a job's wake: the settler does not look"
    dependency = c.enqueue("t", delay=3600)
    waiting = a.enqueue("t", after=[("c", dependency.id)])
    canceled = []  # from another client
    await watched(lambda: canceled.append(c.run(cancel_call(c.keys, dependency.id))))
    assert canceled == [[b"canceled", b"scheduled"]]
    assert told == ["c"]
    await asyncio.wait_for(settler.step(), PATIENCE)

    assert a.where(waiting.id) is State.DEAD, "the dependency was canceled: the waiting job fails"
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


# -- the idle lease (lua/lease.lua) -----------------------------------------------------------------------

LIMITS = '{"t": {"total": 2}}'


@pytest.fixture
def quiet(server_binary: str, tmp_path: Path) -> Iterator[QueueDriver]:
    """A queue on a server of its own: INFO commandstats counts this test's commands alone."""
    server = RedisServer(server_binary, tmp_path / "quiet").start()
    try:
        with server.client() as client:
            client.script_load(script("lease").source)
            yield QueueDriver(client, "quiet")
    finally:
        server.stop()


def lease_counted(q: QueueDriver, alive: str | None = None, limits: str = "{}") -> tuple[LeaseResult, Counter[str]]:
    """A lease of 10 and the commands Redis ran for it, the ones inside the script too (as bench/idle.py)."""

    def calls() -> Counter[str]:
        stats = q.redis.info("commandstats").items()
        return Counter({name.removeprefix("cmdstat_"): int(n["calls"]) for name, n in stats if "info" not in name})

    before = calls()
    reply = q.run(lease_call(q.keys, 10, 30_000, 3, alive_key=alive, limits=limits))
    return parse_lease(q.keys, reply), calls() - before


@pytest.mark.parametrize("limits", ["{}", LIMITS])
def test_an_idle_lease_runs_time_and_one_exists(quiet: QueueDriver, limits: str) -> None:
    q = quiet
    alive = q.keys.alive("d1")
    q.redis.set(alive, "1")
    for alive_key, exists in ((None, 1), (alive, 2)):  # a one-queue daemon's queued lease asks its alive key too
        result, ran = lease_counted(q, alive_key, limits)
        assert ran == Counter({"evalsha": 1, "time": 1, "exists": exists})
        assert (result.jobs, result.next_due_ms, result.paused, result.declined) == ([], None, False, False)
    q.redis.delete(alive)
    assert lease_counted(q, alive, limits)[0].declined, "a lapsed alive key is still told, on an idle queue too"


def test_a_job_alone_on_its_queue_is_leased_without_reading_the_schedule_or_the_pause(quiet: QueueDriver) -> None:
    """The lease that wakes for a job (ADR 0005) reads `scheduled`, `paused` and the other pending lists
    only when one of them exists, and checks the types of the keys it writes, `active` and `dead`, with
    `pending` read by its LLEN."""
    q = quiet
    job_id = q.enqueue("t").id
    assert q.redis.exists(q.keys.wake)
    result, ran = lease_counted(q)
    assert [leased.job.id for leased in result.jobs] == [job_id]
    assert result.next_due_ms is None
    assert not {"zrange", "zrangebyscore"} & set(ran)
    assert (ran["type"], ran["exists"], ran["llen"]) == (2, 2, 2)
    assert not q.redis.exists(q.keys.wake)


def test_a_wake_with_nothing_to_lease_is_deleted_and_a_far_schedule_read_once(quiet: QueueDriver) -> None:
    q = quiet
    q.redis.rpush(q.keys.wake, "1")
    result, ran = lease_counted(q)
    assert (result.jobs, result.next_due_ms) == ([], None)
    assert not q.redis.exists(q.keys.wake)
    assert "type" not in ran, "nothing written but the wake's deletion: no type checked"
    q.enqueue("t", delay=60)
    result, ran = lease_counted(q)
    assert result.next_due_ms is not None
    assert 59_000 < result.next_due_ms <= 60_000
    assert (ran["zrange"], ran["zrangebyscore"], ran["type"]) == (1, 0, 0), "one read of its head, for both"
    job_id = q.enqueue("t").id
    result, ran = lease_counted(q)
    assert [leased.job.id for leased in result.jobs] == [job_id]
    assert ran["exists"] == 3, "the look, the wake and the pause: the other pending lists are not read"
    assert (ran["zrange"], ran["zrangebyscore"], ran["type"]) == (1, 0, 2)


@pytest.mark.parametrize("key", ["active", "dead"])
@pytest.mark.parametrize("work", ["pending", "due"])
def test_a_key_of_another_type_is_refused_before_the_first_write_and_only_then(
    q: QueueDriver, key: str, work: str
) -> None:
    """A lease that writes nothing takes nothing whatever `active` or `dead` hold; one that would promote a
    due job or pop a pending one refuses first, naming the key, and changes nothing."""
    bad = getattr(q.keys, key)
    q.redis.set(bad, "written by something else")
    assert q.lease().jobs == []
    q.enqueue("later", delay=60)
    assert q.lease().next_due_ms is not None, "a schedule read, not written: no refusal"
    job_id = q.enqueue("t", delay=60 if work == "due" else None).id
    if work == "due":
        q.redis.zadd(q.keys.scheduled, {job_id: 1})
    before = q.snapshot()
    with pytest.raises(redis.ResponseError, match=rf"^WRONGTYPE jobcar: {re.escape(bad)} holds a string, not a zset"):
        q.lease()
    assert q.snapshot() == before


@pytest.mark.parametrize(("key", "kind"), [("pending", "list"), ("scheduled", "zset")])
def test_a_pending_list_or_schedule_of_another_type_is_refused_by_its_first_read(
    q: QueueDriver, key: str, kind: str
) -> None:
    """Read first, they fail before any write; the refusal names the first key of the wrong type in the order
    the lease always checked them (`pending`, `scheduled`, `active`, `dead`)."""
    bad = getattr(q.keys, key)
    q.redis.set(bad, "written by something else")
    q.redis.set(q.keys.dead, "written by something else too")
    before = q.snapshot()
    with pytest.raises(redis.ResponseError, match=rf"^WRONGTYPE jobcar: {re.escape(bad)} holds a string, not a {kind}"):
        q.lease()
    assert q.snapshot() == before
