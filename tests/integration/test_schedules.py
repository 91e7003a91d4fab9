"""Schedules in Redis: created, changed, paused, triggered and removed through the client, and each tick fired
once by the compare-and-set of `schedule_fire`, on standalone and Cluster."""

from __future__ import annotations

import pytest
import redis

from jobcar import State
from jobcar.client import Client
from jobcar.schedules import Step, fire_call, parse_fire, tick_job_id
from tests.integration.driver import QueueDriver
from tests.servers import wait_for


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def client(q: QueueDriver) -> Client:
    return q.producer


def wait_due(q: QueueDriver, name: str) -> int:
    """The schedule's next tick, once Redis time has reached it."""
    state = client(q).schedule(name)
    assert state is not None
    assert state.next_ms is not None
    tick = state.next_ms
    wait_for(lambda: q.now_ms() >= tick, timeout=5, what="the tick to be due")
    return tick


def fire(q: QueueDriver, name: str, step: Step) -> str:
    state = client(q).schedule(name)
    assert state is not None
    return parse_fire(q.run(fire_call(q.keys, state.spec, step, 1 << 20))).outcome


def test_create_change_and_remove_keep_the_index_and_the_next_tick(q: QueueDriver) -> None:
    c = client(q)
    assert c.upsert_schedule("report", type="report.build", every="1h", payload={"a": 1}) == "created"
    first = c.schedule("report")
    assert first is not None
    assert (first.origin, first.paused, first.fires, first.spec.payload) == ("api", False, 0, {"a": 1})
    assert first.next_ms is not None
    assert first.next_ms % 3_600_000 == 0
    assert first.next_ms > q.now_ms()
    assert c.upsert_schedule("report", type="report.build", every="1h", payload={"a": 1}) == "unchanged"
    assert c.schedule("report") == first, "an unchanged spec keeps its tick: a restart fires nothing twice"
    assert c.upsert_schedule("report", type="report.build", every="1h", payload={"a": 2}) == "changed"
    assert [s.spec.name for s in c.schedules()] == ["report"]
    assert q.redis.zscore(q.keys.schedules, "report") == first.next_ms
    assert c.change_schedule("report", "remove") == 1
    assert (c.schedule("report"), c.schedules(), c.change_schedule("report", "remove")) == (None, [], -1)
    assert not q.redis.exists(q.keys.schedule("report"))
    assert not q.redis.exists(q.keys.schedules)


def test_a_tick_fires_once_whoever_fires_it(q: QueueDriver) -> None:
    client(q).upsert_schedule("tick", type="t", every="1s", payload={"n": 1}, priority=2)
    tick = wait_due(q, "tick")
    step = Step(tick, tick, 0, tick + 1000)
    assert fire(q, "tick", step) == "fired"
    assert fire(q, "tick", step) == "moved", "a second daemon with the same step finds the schedule moved on"
    job = q.job(tick_job_id("tick", tick))
    assert job is not None
    assert (job.schedule, job.scheduled_at_ms, job.priority, job.payload) == ("tick", tick, 2, b'{"n":1}')
    state = client(q).schedule("tick")
    assert state is not None
    assert (state.next_ms, state.last_ms, state.last_job, state.fires) == (tick + 1000, tick, job.id, 1)
    assert fire(q, "tick", Step(tick + 1000, tick + 1000, 0, tick + 2000)) in ("early", "fired")


def test_a_tick_not_yet_due_by_redis_time_changes_nothing(q: QueueDriver) -> None:
    client(q).upsert_schedule("later", type="t", every="1h")
    state = client(q).schedule("later")
    assert state is not None
    assert state.next_ms is not None
    tick = state.next_ms
    before = q.snapshot()
    assert fire(q, "later", Step(tick, tick, 0, tick + 3_600_000)) == "early"
    assert q.snapshot() == before


def test_overlap_skip_passes_a_tick_while_the_last_job_waits_or_runs(q: QueueDriver) -> None:
    client(q).upsert_schedule("slow", type="t", every="1s", overlap="skip")
    tick = wait_due(q, "slow")
    assert fire(q, "slow", Step(tick, tick, 0, tick + 1000)) == "fired"
    wait_for(lambda: q.now_ms() >= tick + 1000, timeout=5)
    assert fire(q, "slow", Step(tick + 1000, tick + 1000, 0, tick + 2000)) == "overlap"
    assert q.job(tick_job_id("slow", tick + 1000)) is None
    state = client(q).schedule("slow")
    assert state is not None
    assert (state.fires, state.skipped, state.next_ms) == (1, 1, tick + 2000)


def test_a_limit_ends_the_schedule(q: QueueDriver) -> None:
    client(q).upsert_schedule("once", type="t", every="1s", limit=1)
    tick = wait_due(q, "once")
    assert fire(q, "once", Step(tick, tick, 0, tick + 1000)) == "fired"
    state = client(q).schedule("once")
    assert state is not None
    assert (state.finished, state.fires) == (True, 1)
    assert q.redis.zscore(q.keys.schedules, "once") is None


def test_pause_resume_and_trigger(q: QueueDriver) -> None:
    c = client(q)
    c.upsert_schedule("p", type="t", every="1h", payload=7)
    assert (c.change_schedule("p", "pause"), c.change_schedule("p", "pause")) == (1, 0)
    assert q.redis.zscore(q.keys.schedules, "p") is None
    job_id = c.trigger_schedule("p")
    assert job_id is not None
    assert job_id.startswith("p@manual-")
    job = q.job(job_id)
    assert job is not None
    assert (job.schedule, job.payload, q.where(job_id)) == ("p", b"7", State.PENDING)
    assert job.scheduled_at_ms is not None
    assert abs(job.scheduled_at_ms - q.now_ms()) < 60_000
    state = c.schedule("p")
    assert state is not None
    assert (state.paused, state.fires) == (True, 0), "a trigger moves no tick and counts no fire"
    assert c.change_schedule("p", "resume") == 1
    resumed = c.schedule("p")
    assert resumed is not None
    assert resumed.next_ms is not None
    assert q.redis.zscore(q.keys.schedules, "p") == resumed.next_ms
    assert c.trigger_schedule("nothing") is None
    with pytest.raises(ValueError, match="paused, resumed or removed"):
        c.change_schedule("p", "explode")
