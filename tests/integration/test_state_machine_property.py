"""Guarantee #5 of docs/delivery-semantics.md: a hypothesis RuleBasedStateMachine drives every transition
against a real server (with AOF, restarted mid-run) and checks the store against a model after every step:
each job in exactly one state, none lost, lease tokens unique, attempts never above max_attempts.

Time: scripts read Redis TIME, which a test cannot set. "Advancing time" therefore shifts every
run-at and lease deadline in the scheduled and active sets back by the same amount, which is what
the scripts would see had the clock moved forward. All virtual durations are multiples of 5 s and
the lease and delay are 32.5 s, so no step ever lands within 2.5 s of a deadline (a real example
runs far faster than that).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from jobcar import State, transitions
from jobcar.transitions import ExtendStatus, RetryResult
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer

LEASE_MS = 32_500
DELAY_MS = 32_500
STEP_MS = st.sampled_from([5_000, 10_000, 25_000, 45_000])
EXAMPLES = 200


@dataclass
class ModelJob:
    id: str
    max_attempts: int
    state: State
    attempt: int = 0
    token: str | None = None
    lease_left_ms: int = 0  # while active
    due_in_ms: int = 0  # while scheduled
    old_tokens: list[str] = field(default_factory=list)


class StoreMachine(RuleBasedStateMachine):
    server: RedisServer  # set by the test below
    examples_run = 0

    def __init__(self) -> None:
        super().__init__()
        StoreMachine.examples_run += 1
        self.client = self.server.client()
        self.q = QueueDriver(self.client, f"p{uuid.uuid4().hex[:10]}")
        self.jobs: dict[str, ModelJob] = {}
        self.gone: dict[str, ModelJob] = {}  # acked: no trace may remain
        self.tokens_seen: set[str] = set()
        self.restarted = False

    def teardown(self) -> None:
        self.client.close()

    def in_state(self, state: State) -> list[ModelJob]:
        return sorted((j for j in self.jobs.values() if j.state is state), key=lambda j: j.id)

    # -- rules ------------------------------------------------------------------------------

    @rule(delayed=st.booleans(), max_attempts=st.integers(1, 3))
    def enqueue(self, delayed: bool, max_attempts: int) -> None:
        options = {"delay": DELAY_MS / 1000} if delayed else {}
        # Ids in enqueue order: hypothesis replays an example and must see the same order every time
        # (ties in a sorted set, and our own sorting, go by id).
        job_id = f"j{len(self.jobs) + len(self.gone):04d}"
        info = self.q.enqueue("prop", max_attempts=max_attempts, job_id=job_id, **options)
        expected = State.SCHEDULED if delayed else State.PENDING
        assert info.created
        assert info.state is expected
        self.jobs[info.id] = ModelJob(info.id, max_attempts, expected, due_in_ms=DELAY_MS if delayed else 0)

    @rule(count=st.integers(1, 4))
    def lease(self, count: int) -> None:
        runnable = {j.id for j in self.jobs.values() if j.state is State.PENDING}
        runnable |= {j.id for j in self.in_state(State.SCHEDULED) if j.due_in_ms <= 0}
        result = self.q.lease(count=count, lease_ms=LEASE_MS)
        leased = {lj.job.id: lj for lj in result.jobs}
        assert len(leased) == min(count, len(runnable)), (leased.keys(), runnable)
        assert leased.keys() <= runnable
        for job_id, lj in leased.items():
            model = self.jobs[job_id]
            assert lj.token not in self.tokens_seen, "a lease token was issued twice"
            self.tokens_seen.add(lj.token)
            assert lj.job.attempt == model.attempt + 1
            model.state, model.attempt, model.token, model.lease_left_ms = (
                State.ACTIVE,
                model.attempt + 1,
                lj.token,
                LEASE_MS,
            )
        for model in self.in_state(State.SCHEDULED):
            if model.due_in_ms <= 0:
                model.state = State.PENDING  # promoted by the lease script

    @precondition(lambda self: self.in_state(State.ACTIVE))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self.in_state(State.ACTIVE)))
        assert self.q.ack(model.id, model.token or "") == 1
        self._drop_lease(model)
        self.gone[model.id] = self.jobs.pop(model.id)

    @precondition(lambda self: self.in_state(State.ACTIVE))
    @rule(data=st.data(), delayed=st.booleans(), spend=st.booleans())
    def retry(self, data: st.DataObject, delayed: bool, spend: bool) -> None:
        model = data.draw(st.sampled_from(self.in_state(State.ACTIVE)))
        result = self.q.retry(model.id, model.token or "", delay_ms=DELAY_MS if delayed else 0, spend=spend)
        self._drop_lease(model)
        if spend and model.attempt >= model.max_attempts:
            assert result == RetryResult.DEAD
            model.state = State.DEAD
            return
        assert result == RetryResult.RETRIED
        if not spend:
            model.attempt -= 1
        model.state, model.due_in_ms = (State.SCHEDULED, DELAY_MS) if delayed else (State.PENDING, 0)

    @precondition(lambda self: self.in_state(State.ACTIVE))
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self.in_state(State.ACTIVE)))
        assert self.q.kill(model.id, model.token or "") == 1
        self._drop_lease(model)
        model.state = State.DEAD

    @precondition(lambda self: self.in_state(State.ACTIVE))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self.in_state(State.ACTIVE)))
        assert self.q.extend([(model.id, model.token or "")], lease_ms=LEASE_MS) == [ExtendStatus.RENEWED]
        model.lease_left_ms = LEASE_MS

    @precondition(lambda self: any(j.old_tokens for j in [*self.jobs.values(), *self.gone.values()]))
    @rule(data=st.data(), op=st.sampled_from(["extend", "ack", "retry", "kill"]))
    def stale_write_is_fenced(self, data: st.DataObject, op: str) -> None:
        everyone = [*self.jobs.values(), *self.gone.values()]
        candidates = sorted((j for j in everyone if j.old_tokens), key=lambda j: j.id)
        model = data.draw(st.sampled_from(candidates))
        token = data.draw(st.sampled_from(model.old_tokens))
        before = self.q.snapshot()
        if op == "extend":
            assert self.q.extend([(model.id, token)]) == [ExtendStatus.LOST]
        elif op == "ack":
            assert self.q.ack(model.id, token) == 0
        elif op == "retry":
            assert self.q.retry(model.id, token) == RetryResult.LOST
        else:
            assert self.q.kill(model.id, token) == 0
        assert self.q.snapshot() == before, f"a stale {op} changed the store"

    @rule()
    def reap(self) -> None:
        expected = {}
        for model in self.in_state(State.ACTIVE):
            if model.lease_left_ms < 0:
                expected[model.id] = "dead" if model.attempt >= model.max_attempts else "pending"
        assert self.q.reap() == expected
        for job_id, where in expected.items():
            model = self.jobs[job_id]
            self._drop_lease(model)
            model.state = State.DEAD if where == "dead" else State.PENDING

    @rule(step=STEP_MS)
    def advance_time(self, step: int) -> None:
        for key in (self.q.keys.scheduled, self.q.keys.active):
            entries = self.client.zrange(key, 0, -1, withscores=True)
            if entries:
                self.client.zadd(key, {member: score - step for member, score in entries})
        for model in self.jobs.values():
            model.lease_left_ms -= step
            model.due_in_ms -= step

    @precondition(lambda self: self.in_state(State.DEAD))
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(self.in_state(State.DEAD)))
        assert self.q.run(transitions.requeue_call(self.q.keys, [model.id])) == 1
        model.state, model.attempt = State.PENDING, 0

    @precondition(lambda self: not self.restarted)
    @rule()
    def restart_redis(self) -> None:
        """A clean restart: with appendfsync always nothing is lost, and the script cache is empty."""
        self.client.close()
        self.server.stop()
        self.server.start()
        self.restarted = True

    def _drop_lease(self, model: ModelJob) -> None:
        if model.token:
            model.old_tokens.append(model.token)
        model.token = None

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def every_job_in_exactly_one_state(self) -> None:
        keys = self.q.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.lrange(keys.pending, 0, -1)
        for key in (keys.scheduled, keys.active, keys.dead):
            pipe.zrange(key, 0, -1)
        ids = sorted([*self.jobs, *self.gone])
        for job_id in ids:
            pipe.hmget(keys.job(job_id), "state", "attempt")
        pending, scheduled, active, dead, *fields = pipe.execute()
        members = {State.PENDING: pending, State.SCHEDULED: scheduled, State.ACTIVE: active, State.DEAD: dead}
        seen = [m.decode() for listed in members.values() for m in listed]
        assert len(seen) == len(set(seen)), f"an id is in two state sets: {members}"
        assert set(seen) == set(self.jobs), f"store {sorted(seen)} != model {sorted(self.jobs)}"
        by_id = dict(zip(ids, fields, strict=True))
        for job_id, model in self.jobs.items():
            assert job_id.encode() in members[model.state], f"{job_id} should be {model.state}"
            state, attempt = by_id[job_id]
            assert state == model.state.value.encode(), f"{job_id}: hash says {state}, model {model.state}"
            assert int(attempt or 0) == model.attempt <= model.max_attempts
        for job_id in self.gone:
            assert by_id[job_id] == [None, None], f"acked job {job_id} left a trace"


@pytest.fixture(scope="module")
def aof_server(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(
        server_binary,
        Path(tmp_path_factory.mktemp("aof")),
        extra_args=("--appendonly", "yes", "--appendfsync", "always"),
    ).start()
    yield server
    server.stop()


def test_state_machine_against_a_model(aof_server: RedisServer) -> None:
    StoreMachine.server = aof_server
    StoreMachine.examples_run = 0
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    print(f"state machine examples run: {StoreMachine.examples_run}")
    assert StoreMachine.examples_run >= EXAMPLES


def test_acknowledged_enqueues_survive_a_restart(aof_server: RedisServer, namespace: str) -> None:
    """Enqueues acknowledged before a restart are there after it (appendfsync always)."""
    with aof_server.client() as client:
        driver = QueueDriver(client, namespace)
        ids = [i.id for i in driver.producer.enqueue_many([("t", n) for n in range(100)])]
    aof_server.stop()
    aof_server.start()
    with aof_server.client() as client:
        driver = QueueDriver(client, namespace)
        assert [j.decode() for j in reversed(client.lrange(driver.keys.pending, 0, -1))] == ids
