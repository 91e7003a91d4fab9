"""The daemon's job-loop parts in-process, against the session's real server: no daemon subprocess.

Each test wires the parts as the daemon does (`runner.Runner`: one RedisLink, Metrics, Attempts, Leaser,
Heartbeat and Reaper) without starting its loops, seeds Redis through QueueDriver, drives one part by
hand (a lease step, a reap, a beat, an attempt) and reads what it did from Redis and from the metrics.
Handlers are tiny in-process executors defined here: one returns a chosen Outcome, the other runs until
the test finishes it. Tests wait on conditions (`eventually`), never for a length of time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
import redis

from jobcar import transport
from jobcar.attempt_desk import LiveAttempt
from jobcar.attempts import Attempts, StopReason
from jobcar.config_types import Backoff, BackoffStrategy, BatchDelivery, Config, Handler, HttpHandler, RedisSettings
from jobcar.executors import Executor
from jobcar.heartbeat import Heartbeat
from jobcar.job import Job, State
from jobcar.leasing import IDLE_WAIT_MAX, Leaser, QueueState
from jobcar.metrics import OUTCOMES, Metrics
from jobcar.outcome import Outcome
from jobcar.reaper import Reaper
from jobcar.recording import Recorded, outcome_call
from jobcar.redis_link import RedisLink, RedisUnavailable, connect
from jobcar.runner import Runner
from jobcar.transitions import LeasedJob, RetryResult, cancel_call, pause_call, split_reply
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, free_port

#: Every wait on a condition gives up after this long: far above what a loaded 2-core machine needs.
PATIENCE = 10.0


# -- servers, config and the parts ----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One server as a test sees it: a sync client to seed and inspect queues, and the URL the parts use."""

    redis: redis.Redis | redis.RedisCluster
    url: str
    cluster: bool
    namespace: str

    def driver(self, queue: str = "default") -> QueueDriver:
        return QueueDriver(self.redis, self.namespace, queue)


@pytest.fixture
def target(redis_server: RedisServer, r: redis.Redis, namespace: str) -> Target:
    """The session's standalone server."""
    return Target(r, redis_server.url, cluster=False, namespace=namespace)


@pytest.fixture
def any_target(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> Target:
    """The standalone server, then the 3-master Cluster."""
    if isinstance(any_redis, redis.RedisCluster):
        node = any_redis.get_default_node()  # type: ignore[no-untyped-call]
        return Target(any_redis, f"redis://{node.host}:{node.port}", cluster=True, namespace=namespace)
    port = any_redis.connection_pool.connection_kwargs["port"]
    return Target(any_redis, f"redis://127.0.0.1:{port}/0", cluster=False, namespace=namespace)


def handler(*, concurrency: int | None = None, backoff_s: float = 30.0, batch: BatchDelivery | None = None) -> Handler:
    """A handler entry for type "t". Its URL is never called: the tests give Attempts their own executor.
    A constant backoff makes a retry without Retry-After land in scheduled, `backoff_s` ahead."""
    backoff = Backoff(strategy=BackoffStrategy.CONSTANT, base=backoff_s, max=backoff_s)
    return HttpHandler(type="t", timeout=60.0, max_attempts=3, backoff=backoff, max_retry_after=3600.0,
                       url="http://127.0.0.1:9/unused", concurrency=concurrency, batch=batch)  # fmt: skip


def make_config(target: Target, **fields: Any) -> Config:
    fields.setdefault("handlers", {"t": handler()})
    return Config(source="test", redis=RedisSettings(url=target.url, cluster=target.cluster),
                  namespace=target.namespace, **fields)  # fmt: skip


@dataclass
class Parts:
    """The job-loop parts of one daemon, wired by `Runner` but with none of its loops started."""

    runner: Runner

    @property
    def config(self) -> Config:
        return self.runner.config

    @property
    def link(self) -> RedisLink:
        return self.runner.link

    @property
    def metrics(self) -> Metrics:
        return self.runner.metrics

    @property
    def attempts(self) -> Attempts:
        return self.runner.attempts

    @property
    def leaser(self) -> Leaser:
        return self.runner.leaser

    @property
    def heartbeat(self) -> Heartbeat:
        return self.runner.heartbeat

    @property
    def reaper(self) -> Reaper:
        return self.runner.reaper

    def queue(self, name: str = "default") -> QueueState:
        return next(q for q in self.leaser.queues if q.keys.queue == name)

    def running_ids(self, queue: str = "default") -> list[str]:
        return sorted(job_id for q, job_id in self.attempts.running if q == queue)

    def sample(self, name: str, **labels: str) -> float:
        """A series' value as Prometheus scrapes it (0 when it does not exist)."""
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def finished(self, queue: str = "default", job_type: str = "t") -> dict[str, float]:
        """jobcar_jobs_finished_total of a queue and type, by outcome; outcomes never counted are left out."""
        labels = {"queue": self.metrics.queue(queue), "type": self.metrics.type(job_type)}
        counts = {o: self.sample("jobcar_jobs_finished_total", **labels, outcome=o) for o in OUTCOMES}
        return {outcome: n for outcome, n in counts.items() if n}

    async def settle(self) -> None:
        """Wait until every attempt started here has ended: recorded its outcome, or stopped."""
        tasks = set(self.attempts.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=PATIENCE)
            assert not pending, f"{len(pending)} attempts still running after {PATIENCE}s"


MakeParts = Callable[..., Awaitable[Parts]]


@pytest_asyncio.fixture
async def make_parts() -> AsyncIterator[MakeParts]:
    """`await make_parts(target, executors, **config_fields)`: the parts for the target's namespace. The
    default config has the queue "default" and a handler for type "t". Attempts still running at the end
    are cancelled and the clients closed."""
    built: list[Parts] = []

    async def make(target: Target, executors: Mapping[str, Executor] | None = None, **config_fields: Any) -> Parts:
        config = make_config(target, **config_fields)
        metrics = Metrics(config)
        link = RedisLink(
            connect(target.url, cluster=target.cluster),
            connect(target.url, cluster=target.cluster, blocking_wait=IDLE_WAIT_MAX),
            on_failure=metrics.redis_errors.inc,
        )
        parts = Parts(Runner(config, link, executors or {}, metrics=metrics))
        built.append(parts)
        return parts

    yield make
    for parts in built:
        tasks = list(parts.attempts.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await parts.leaser.close()
        await parts.link.aclose()


async def eventually(condition: Callable[[], object], what: str, within: float = PATIENCE) -> None:
    """Poll `condition` until it holds, yielding to the loop in between; fail after `within` seconds."""
    deadline = time.monotonic() + within
    delay = 0.001
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def until_expired(q: QueueDriver, *job_ids: str) -> None:
    """Wait until the leases of these jobs have expired at Redis time (the server runs on this host, so its
    clock is ours). The reaper takes deadlines strictly before its `now`, in whole milliseconds."""
    deadlines = [q.redis.zscore(q.keys.active, job_id) for job_id in job_ids]
    assert None not in deadlines, f"not all of {job_ids} are leased"
    latest = max(d for d in deadlines if d is not None)
    await eventually(lambda: time.time() * 1000 > latest + 1, what=f"the leases of {job_ids} to expire")


# -- executors: real in-process handlers ----------------------------------------------------------


@dataclass
class Returns:
    """An executor whose every run returns `outcome`, or raises it (a bug inside an executor)."""

    outcome: Outcome | Exception
    ran: list[str] = field(default_factory=list)

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        self.ran.append(job.id)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class Held:
    """An executor whose runs last until the test finishes them, or until they are cancelled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self._outcomes: dict[str, asyncio.Future[Outcome]] = {}

    def _outcome(self, job_id: str) -> asyncio.Future[Outcome]:
        if job_id not in self._outcomes:
            self._outcomes[job_id] = asyncio.get_running_loop().create_future()
        return self._outcomes[job_id]

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        self.started.append(job.id)
        try:
            return await self._outcome(job.id)
        except asyncio.CancelledError:
            self.cancelled.append(job.id)
            raise

    def finish(self, job_id: str, outcome: Outcome | None = None) -> None:
        self._outcome(job_id).set_result(outcome or Outcome.success())


# -- the reaper -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_reap_returns_an_expired_lease_to_pending_keeping_its_attempt(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target)
    q = any_target.driver()
    job_id = q.enqueue("t").id
    q.lease_one(lease_ms=1, max_attempts=3)
    await until_expired(q, job_id)

    assert await parts.reaper.reap() == {"default": {job_id: "pending"}}
    assert q.where(job_id) is State.PENDING
    job = q.job(job_id)
    assert job is not None
    assert job.attempt == 1, "the expired attempt still counts"
    assert job.token is None
    assert job.last_error == "lease expired: the daemon running attempt 1 stopped renewing it"
    assert q.redis.exists(q.keys.wake) == 1, "a job back in pending wakes idle daemons"


@pytest.mark.asyncio
async def test_reap_moves_an_expired_lease_of_the_last_attempt_to_dead(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target)
    q = any_target.driver()
    job_id = q.enqueue("t").id
    q.lease_one(lease_ms=1, max_attempts=1)
    await until_expired(q, job_id)

    assert await parts.reaper.reap() == {"default": {job_id: "dead"}}
    assert q.where(job_id) is State.DEAD
    job = q.job(job_id)
    assert job is not None
    assert job.last_error is not None
    assert job.last_error.endswith("(attempts exhausted: 1 of 1)")


@pytest.mark.asyncio
async def test_reap_says_where_each_expired_job_of_each_queue_went_and_counts_them(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target, queues={"default": 1, "low": 1})
    default, low = any_target.driver("default"), any_target.driver("low")
    again, spent, other = default.enqueue("t").id, default.enqueue("t").id, low.enqueue("t").id
    default.lease_one(lease_ms=1, max_attempts=3)
    default.lease_one(lease_ms=1, max_attempts=1)
    low.lease_one(lease_ms=1)
    low.redis.zadd(low.keys.active, {"ghost": 1})  # an id in the active set without a job hash
    await until_expired(default, again, spent)
    await until_expired(low, other)

    reaped = await parts.reaper.reap()

    assert reaped == {"default": {again: "pending", spent: "dead"}, "low": {other: "pending", "ghost": "missing"}}
    counted = {
        (queue, to): parts.sample("jobcar_leases_reaped_total", queue=queue, to=to)
        for queue in ("default", "low")
        for to in ("pending", "dead")
    }
    assert counted == {("default", "pending"): 1, ("default", "dead"): 1, ("low", "pending"): 1, ("low", "dead"): 0}


@pytest.mark.asyncio
async def test_reap_with_no_expired_lease_changes_nothing(any_target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(any_target)
    q = any_target.driver()
    q.enqueue("t")
    q.lease_one(lease_ms=60_000)  # running, lease live
    q.enqueue("t")  # pending
    q.enqueue("t", delay=60)  # scheduled
    dead = q.lease_one()
    q.kill(dead.job.id, dead.token)
    before = q.snapshot()

    assert await parts.reaper.reap() == {"default": {}}
    assert q.snapshot() == before
    assert parts.sample("jobcar_leases_reaped_total", queue="default", to="pending") == 0
    assert parts.sample("jobcar_leases_reaped_total", queue="default", to="dead") == 0


# -- the lease step -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_lease_step_leases_at_most_the_free_slots_and_starts_them(target: Target, make_parts: MakeParts) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held}, concurrency=3)
    q = target.driver()
    ids = [q.enqueue("t").id for _ in range(6)]
    queue = parts.queue()
    queue.reserved = 1  # as while a watcher's lease waits behind its BLMOVE

    await parts.leaser.step()
    assert parts.running_ids() == sorted(ids[:2]), "3 slots, 1 reserved: 2 leased, oldest first"
    assert q.redis.llen(q.keys.pending) == 4
    assert queue.ready, "a lease that got all it asked for leaves the queue ready"
    assert not queue.went_idle.is_set()

    queue.reserved = 0
    await parts.leaser.step()
    assert parts.running_ids() == sorted(ids[:3])
    assert q.redis.llen(q.keys.pending) == 3
    await eventually(lambda: len(held.started) == 3, "the three handlers to start")


@pytest.mark.asyncio
async def test_lease_step_with_no_free_slot_waits_for_one_and_leases_nothing(
    target: Target, make_parts: MakeParts
) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held}, concurrency=2)
    q = target.driver()
    ids = [q.enqueue("t").id for _ in range(4)]
    await parts.leaser.step()
    assert parts.running_ids() == sorted(ids[:2])

    waiting = asyncio.create_task(parts.leaser.step())
    await eventually(lambda: len(held.started) == 2, "the two handlers to start")
    assert not waiting.done(), "with every slot taken the step waits"
    held.finish(ids[0])  # frees a slot: the step returns, and only the next one leases
    await asyncio.wait_for(waiting, PATIENCE)
    assert q.redis.llen(q.keys.pending) == 2

    await parts.leaser.step()
    assert parts.running_ids() == sorted([ids[1], ids[2]])
    assert q.redis.llen(q.keys.pending) == 1


@pytest.mark.asyncio
async def test_lease_step_marks_the_queue_idle_when_it_ran_short(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, {"t": Held()}, concurrency=5)
    q = target.driver()
    job_id = q.enqueue("t").id
    q.enqueue("t", delay=60)
    queue = parts.queue()

    await parts.leaser.step()

    assert parts.running_ids() == [job_id]
    assert not queue.ready, "1 of 5 leased: the queue waits for a wake"
    assert queue.went_idle.is_set()
    assert queue.due_at is not None
    assert 50 < queue.due_at - time.monotonic() <= 60, "…or for its scheduled job"


@pytest.mark.asyncio
async def test_lease_step_on_a_paused_queue_leases_nothing_and_goes_idle(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, {"t": Held()})
    q = target.driver()
    q.run(pause_call(q.keys, True))
    q.enqueue("t")
    q.enqueue("t")
    q.enqueue("t", delay=60)
    queue = parts.queue()

    await parts.leaser.step()

    assert parts.attempts.running == {}
    assert q.redis.llen(q.keys.pending) == 2
    assert not queue.ready
    assert queue.went_idle.is_set()
    assert queue.due_at is None, "a paused queue's scheduled jobs wait for the resume's wake, not a timer"


@pytest.mark.asyncio
async def test_lease_step_moves_a_malformed_job_hash_to_the_dead_letter_queue(
    target: Target, make_parts: MakeParts
) -> None:
    """A hash written around the enqueue script (corruption, a buggy producer) cannot be run: it is killed,
    and the step goes on with the good jobs. (An attempt that is not a number or an unknown state is not
    malformed: the lease overwrites both.)"""
    parts = await make_parts(target, {"t": Held()})
    q = target.driver()
    q.redis.hset(q.keys.job("broken"), mapping={"type": "t", "payload": "{}", "state": "pending", "created": "x"})
    q.redis.lpush(q.keys.pending, "broken")
    good = q.enqueue("t").id

    await parts.leaser.step()

    assert parts.running_ids() == [good]
    assert q.redis.zscore(q.keys.dead, "broken") is not None
    assert q.redis.zscore(q.keys.active, "broken") is None
    assert q.redis.hget(q.keys.job("broken"), "state") == b"dead"
    assert b"malformed job" in (q.redis.hget(q.keys.job("broken"), "errors") or b"")


# -- queue choice in the lease step (pick's weights and strict order: tests/unit/test_queue_choice.py) --


@pytest.mark.asyncio
async def test_lease_step_never_leases_from_an_idle_queue_before_its_due_time(
    target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(target, {"t": Held()}, queues={"a": 1, "b": 1})
    a, b = target.driver("a"), target.driver("b")
    b_ids = [b.enqueue("t").id for _ in range(2)]
    queue_a, queue_b = parts.queue("a"), parts.queue("b")
    queue_b.idle(60_000)  # as after a lease that found b empty, with a job due in a minute

    for _ in range(5):  # were b a candidate, one of five draws at equal weights would almost surely take it
        a.enqueue("t")
        queue_a.ready = True  # as its watcher does when a wake comes
        await parts.leaser.step()
    assert len(parts.running_ids("a")) == 5
    assert parts.running_ids("b") == []
    assert b.redis.llen(b.keys.pending) == 2

    queue_b.due_at = time.monotonic()  # its due time has come (the timer of the daemon's lease loop)
    await parts.leaser.step()
    assert parts.running_ids("b") == sorted(b_ids)


@pytest.mark.asyncio
async def test_lease_step_with_strict_priority_drains_the_first_queue_before_the_next(
    target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(target, {"t": Held()}, queues={"high": 1, "low": 100}, strict_priority=True)
    high, low = target.driver("high"), target.driver("low")
    high_ids = [high.enqueue("t").id for _ in range(2)]
    low_ids = [low.enqueue("t").id for _ in range(2)]

    await parts.leaser.step()
    assert parts.running_ids("high") == sorted(high_ids)
    assert parts.running_ids("low") == []
    assert not parts.queue("high").ready

    await parts.leaser.step()
    assert parts.running_ids("low") == sorted(low_ids)


# -- recording an outcome: outcome_call against Redis ---------------------------------------------


def record_alone(q: QueueDriver, config: Config, leased: LeasedJob, outcome: Outcome, **options: Any) -> Recorded:
    """Record `outcome` of `leased` as Attempts does, but in a round trip of its own. The reply goes
    through `split_reply` as the batcher's does: an ack's reply is a list (one value per job it carried)."""
    recording = outcome_call(config, q.keys, leased, outcome, **options)
    (reply,) = transport.execute(q.redis, [recording.call])
    (own,) = split_reply(recording.call, reply, 1)
    return recording.recorded(own)


def test_a_recorded_end_says_when_it_left_an_entry_so_the_daemon_settles_at_once(any_target: Target) -> None:
    a, b = any_target.driver("a"), any_target.driver("b")
    config = make_config(any_target)
    a.enqueue("t", max_attempts=1)
    b.enqueue("t", after=[a.enqueue("t", max_attempts=1)])  # the second: a job in b waits for it
    first, second = a.lease(count=2).jobs
    assert a.retry(first.job.id, first.token) == RetryResult.DEAD
    assert a.retry(second.job.id, second.token) == RetryResult.DEAD_AND_TELLS
    # What the daemon reads from such replies, for each way of ending: the settler is woken on the second.
    retry = outcome_call(config, a.keys, first, Outcome.retry("e"))
    kill = outcome_call(config, a.keys, first, Outcome.fail("bad"))
    ack = outcome_call(config, a.keys, first, Outcome.success(b""))
    assert [retry.tells_dependents(r) for r in (1, 2, 3)] == [False, False, True]
    assert [kill.tells_dependents(r) for r in (1, 2)] == [False, True]
    assert [ack.tells_dependents(r) for r in (1, 2)] == [False, True]
    assert retry.recorded(RetryResult.DEAD_AND_TELLS) is Recorded.DEAD


def test_recording_a_success_acks_the_job_done_with_its_result(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one()

    assert record_alone(q, make_config(any_target, result_ttl=60), leased, Outcome.success(b"ok")) is Recorded.DONE
    job = q.job(job_id)
    assert q.where(job_id) is State.DONE
    assert job is not None
    assert job.result == b"ok"
    assert q.redis.zscore(q.keys.active, job_id) is None


def test_recording_a_success_of_a_canceled_job_acks_it_canceled(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one()
    config = make_config(any_target, result_ttl=60)

    assert record_alone(q, config, leased, Outcome.success(), final=State.CANCELED) is Recorded.CANCELED
    assert q.where(job_id) is State.CANCELED


def test_recording_a_failure_kills_the_job_with_its_error(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one()

    assert record_alone(q, make_config(any_target), leased, Outcome.fail("bad input")) is Recorded.DEAD
    job = q.job(job_id)
    assert q.where(job_id) is State.DEAD
    assert job is not None
    assert job.last_error == "bad input"


def test_recording_a_retry_schedules_the_job_after_its_retry_after(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one(max_attempts=3)

    assert record_alone(q, make_config(any_target), leased, Outcome.retry("flaky", after=60)) is Recorded.RETRIED
    job = q.job(job_id)
    assert q.where(job_id) is State.SCHEDULED
    assert job is not None
    assert job.attempt == 1, "the attempt is spent"
    assert job.last_error == "flaky"
    run_at = q.redis.zscore(q.keys.scheduled, job_id)
    assert run_at is not None
    assert job.run_at_ms == run_at
    assert job.errors[-1].at_ms + 60_000 == run_at


def test_recording_a_retry_without_retry_after_waits_the_handlers_backoff(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one()
    config = make_config(any_target, handlers={"t": handler(backoff_s=45)})

    assert record_alone(q, config, leased, Outcome.retry("flaky")) is Recorded.RETRIED
    job = q.job(job_id)
    assert job is not None
    assert job.run_at_ms == job.errors[-1].at_ms + 45_000


@pytest.mark.parametrize(("job_backoff", "expected_ms"), [(2, 2_000), ("90s", 45_000)])
def test_recording_a_retry_of_a_job_with_its_own_backoff_waits_that_capped_at_the_handlers_max(
    any_target: Target, job_backoff: float | str, expected_ms: int
) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t", backoff=job_backoff).id
    leased = q.lease_one()
    config = make_config(any_target, handlers={"t": handler(backoff_s=45)})  # constant: base = max = 45 s

    assert record_alone(q, config, leased, Outcome.retry("flaky")) is Recorded.RETRIED
    job = q.job(job_id)
    assert job is not None
    assert job.run_at_ms == job.errors[-1].at_ms + expected_ms


def test_recording_a_retry_of_the_last_attempt_kills_the_job(any_target: Target) -> None:
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one(max_attempts=1)

    assert record_alone(q, make_config(any_target), leased, Outcome.retry("flaky", after=60)) is Recorded.DEAD
    job = q.job(job_id)
    assert q.where(job_id) is State.DEAD
    assert job is not None
    assert job.last_error == "flaky (attempts exhausted: 1 of 1)"


def test_recording_a_give_back_returns_the_job_to_pending_with_its_attempt(any_target: Target) -> None:
    """A drain gives attempts back however often it happened before: a handler's `max_snoozes` bounds
    only the handlers' own requests for a later slot."""
    q = any_target.driver()
    job_id = q.enqueue("t").id
    leased = q.lease_one(max_attempts=1)
    q.redis.hset(q.keys.job(job_id), "deferrals", 1000)
    give_back = Outcome.retry("shutting down", after=0, spend_attempt=False)

    assert record_alone(q, make_config(any_target), leased, give_back, give_back=True) is Recorded.RETURNED
    job = q.job(job_id)
    assert q.where(job_id) is State.PENDING
    assert job is not None
    assert job.attempt == 0


@pytest.mark.parametrize(
    ("outcome", "give_back"),
    [
        (Outcome.success(), False),
        (Outcome.fail("bad input"), False),
        (Outcome.retry("flaky", after=60), False),
        (Outcome.retry("shutting down", after=0, spend_attempt=False), True),
    ],
    ids=["success", "fail", "retry", "give-back"],
)
def test_recording_any_outcome_with_a_stale_token_is_lease_lost_and_changes_nothing(
    any_target: Target, outcome: Outcome, give_back: bool
) -> None:
    q = any_target.driver()
    q.enqueue("t")
    stale = dataclasses.replace(q.lease_one(), token="a-token-another-lease-replaced")
    before = q.snapshot()

    assert record_alone(q, make_config(any_target), stale, outcome, give_back=give_back) is Recorded.LEASE_LOST
    assert q.snapshot() == before


# -- recording an outcome: Attempts end to end ----------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("outcome", "state", "error", "finished"),
    [
        (Outcome.success(), None, None, "done"),
        (Outcome.fail("bad input"), State.DEAD, "bad input", "dead"),
        (Outcome.retry("flaky", after=60), State.SCHEDULED, "flaky", "retried"),
        (RuntimeError("bug"), State.SCHEDULED, "jobcar internal error: RuntimeError('bug')", "retried"),
    ],
    ids=["success", "fail", "retry", "executor-raised"],
)
async def test_an_attempt_records_its_executors_outcome_in_redis_and_metrics(
    any_target: Target,
    make_parts: MakeParts,
    outcome: Outcome | Exception,
    state: State | None,
    error: str | None,
    finished: str,
) -> None:
    executor = Returns(outcome)
    parts = await make_parts(any_target, {"t": executor})
    q = any_target.driver()
    job_id = q.enqueue("t").id

    parts.attempts.start(q.keys, q.lease_one())
    await parts.settle()

    assert executor.ran == [job_id]
    assert q.where(job_id) is state, "result_ttl 0: a job that succeeded is deleted"
    job = q.job(job_id)
    assert (job.last_error if job else None) == error
    assert parts.finished() == {finished: 1}
    assert parts.attempts.running == {}
    assert parts.sample("jobcar_jobs_in_flight", queue="default") == 0


@pytest.mark.asyncio
async def test_an_attempt_whose_retry_spends_the_last_attempt_is_counted_dead(
    target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(target, {"t": Returns(Outcome.retry("flaky", after=60))})
    q = target.driver()
    job_id = q.enqueue("t").id

    parts.attempts.start(q.keys, q.lease_one(max_attempts=1))
    await parts.settle()

    assert q.where(job_id) is State.DEAD
    assert parts.finished() == {"dead": 1}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("outcome", "max_attempts", "level", "line"),
    [
        (Outcome.retry("exit code 3: SECRET-PAYLOAD echoed", after=2), 3, "INFO",
         "job retried: exit code 3; attempt 1 of 3 failed, the next in 2.0 s"),
        (Outcome.retry("HTTP 503: SECRET-PAYLOAD echoed", after=2), 1, "WARNING",
         "job dead: HTTP 503 (attempts exhausted, attempt 1 of 1); it is in the dead-letter queue"),
        (Outcome.fail("exit code 64: SECRET-PAYLOAD echoed"), 3, "WARNING",
         "job dead: exit code 64 (a permanent failure, attempt 1 of 3); it is in the dead-letter queue"),
    ],
    ids=["retried", "attempts-exhausted", "permanent"],
)  # fmt: skip
async def test_a_failed_attempt_logs_why_and_what_became_of_the_job_but_no_handler_output(
    target: Target,
    make_parts: MakeParts,
    caplog: pytest.LogCaptureFixture,
    outcome: Outcome,
    max_attempts: int,
    level: str,
    line: str,
) -> None:
    parts = await make_parts(target, {"t": Returns(outcome)})
    q = target.driver()
    q.enqueue("t", max_attempts=max_attempts)

    with caplog.at_level(logging.INFO, logger="jobcar"):
        parts.attempts.start(q.keys, q.lease_one())
        await parts.settle()

    finished = [r for r in caplog.records if r.name == "jobcar.attempts" and r.getMessage().startswith("job ")]
    assert [(r.levelname, r.getMessage()) for r in finished] == [(level, line)]
    assert finished[0].__dict__["outcome"] in ("retried", "dead"), "the metrics' outcome names"
    assert "SECRET-PAYLOAD" not in caplog.text, "handler output may echo the payload: debug only"


@pytest.mark.asyncio
async def test_an_attempt_of_a_type_without_a_handler_is_killed(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, {"t": Returns(Outcome.success())})
    q = target.driver()
    job_id = q.enqueue("unknown.type").id

    parts.attempts.start(q.keys, q.lease_one())
    await parts.settle()

    job = q.job(job_id)
    assert q.where(job_id) is State.DEAD
    assert job is not None
    assert job.last_error == "no handler for type unknown.type"
    assert parts.finished(job_type="unknown.type") == {"dead": 1}, "counted under the type label `other`"


@pytest.mark.asyncio
async def test_an_attempt_stopped_by_a_drain_gives_its_job_back_unspent(target: Target, make_parts: MakeParts) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held})
    q = target.driver()
    job_id = q.enqueue("t").id
    parts.attempts.start(q.keys, q.lease_one())
    await eventually(lambda: held.started == [job_id], "the handler to start")

    parts.attempts.stop_all(StopReason.SHUTDOWN)
    await parts.settle()

    assert held.cancelled == [job_id]
    job = q.job(job_id)
    assert q.where(job_id) is State.PENDING
    assert job is not None
    assert job.attempt == 0
    assert parts.finished() == {"returned": 1}
    assert parts.attempts.returned_on_shutdown == 1


@pytest.mark.asyncio
async def test_an_attempt_started_after_the_drain_began_never_runs_its_handler(
    target: Target, make_parts: MakeParts
) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held})
    q = target.driver()
    job_id = q.enqueue("t").id
    parts.runner.drain()

    parts.attempts.start(q.keys, q.lease_one())
    await parts.settle()

    assert held.started == []
    job = q.job(job_id)
    assert q.where(job_id) is State.PENDING
    assert job is not None
    assert job.attempt == 0
    assert parts.finished() == {"returned": 1}


@pytest.mark.asyncio
async def test_an_attempt_of_a_type_at_its_concurrency_limit_waits_for_that_types_slot(
    target: Target, make_parts: MakeParts
) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held}, handlers={"t": handler(concurrency=1)})
    q = target.driver()
    first, second = q.enqueue("t").id, q.enqueue("t").id
    for leased in q.lease(count=2).jobs:
        parts.attempts.start(q.keys, leased)

    await eventually(lambda: held.started, "a handler to start")
    assert held.started == [first]
    assert parts.running_ids() == sorted([first, second]), "the waiting attempt holds one of the daemon's slots"
    held.finish(first)
    await eventually(lambda: held.started == [first, second], "the second handler to start")
    held.finish(second)
    await parts.settle()
    assert parts.finished() == {"done": 2}


class HeldCalls:
    """A batched handler's executor whose calls last until the test finishes them; `calls` is shared by the
    executors a reload builds (each reload builds new ones, as the daemon does)."""

    def __init__(self, calls: list[tuple[HeldCalls, list[str], asyncio.Future[None]]]) -> None:
        self.calls = calls

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        raise AssertionError("a batched handler's jobs go through run_batch")

    async def run_batch(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float,
        max_attempts: Sequence[int],
        attempts: Sequence[LiveAttempt] = (),
    ) -> list[Outcome]:
        done = asyncio.get_running_loop().create_future()
        self.calls.append((self, [job.id for job in jobs], done))
        await done
        return [Outcome.success()] * len(jobs)


async def test_a_reload_keeps_a_batched_handlers_call_limit_and_sends_later_batches_with_the_new_executor(
    target: Target, make_parts: MakeParts
) -> None:
    calls: list[tuple[HeldCalls, list[str], asyncio.Future[None]]] = []
    handlers = {"t": handler(concurrency=1, batch=BatchDelivery(max_size=2, max_wait=0.01))}
    old = HeldCalls(calls)
    parts = await make_parts(target, {"t": old}, handlers=handlers)
    q = target.driver()
    first = [q.enqueue("t").id for _ in range(2)]
    for leased in q.lease(count=2).jobs:
        parts.attempts.start(q.keys, leased)
    await eventually(lambda: len(calls) == 1, "the first batch's call")

    new = HeldCalls(calls)
    parts.runner.apply(parts.config, {"t": new})  # a SIGHUP with the file unchanged
    second = [q.enqueue("t").id for _ in range(2)]
    for leased in q.lease(count=2).jobs:
        parts.attempts.start(q.keys, leased)
    # The second batch is full (max_size 2), so it is sent at once: its call's task then waits for the slot.
    await eventually(lambda: sum(task.get_name() == "batch of t" for task in asyncio.all_tasks()) == 2,
                     "the second batch sent")  # fmt: skip
    await asyncio.sleep(0)  # one turn of the loop, no I/O: a call given a free slot would have begun by now
    assert len(calls) == 1, "concurrency 1 counts calls across the reload"
    calls[0][2].set_result(None)
    await eventually(lambda: len(calls) == 2, "the second batch's call")
    assert [(executor, sorted(ids)) for executor, ids, _ in calls] == [(old, sorted(first)), (new, sorted(second))]
    calls[1][2].set_result(None)
    await parts.settle()
    assert parts.finished() == {"done": 4}


# -- RedisLink.call --------------------------------------------------------------------------------


def closed_link() -> tuple[RedisLink, list[None]]:
    """A link to a port nobody listens on, and the list its failures are reported to."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    failures: list[None] = []
    link = RedisLink(connect(url, cluster=False), connect(url, cluster=False), on_failure=lambda: failures.append(None))
    return link, failures


@pytest.mark.asyncio
async def test_a_call_redis_fails_raises_redis_unavailable_and_marks_redis_unreachable() -> None:
    link, failures = closed_link()
    try:
        with pytest.raises(RedisUnavailable):
            await link.call(lambda: link.client.ping())
        assert not link.reachability.reachable
        assert link.reachability.failures == 1
        assert len(failures) == 1
    finally:
        await link.aclose()


@pytest.mark.asyncio
async def test_a_call_that_succeeds_after_a_failure_marks_redis_reachable_and_wakes_paused_loops(
    target: Target,
) -> None:
    link, _ = closed_link()
    working = connect(target.url, cluster=False)
    recoveries: list[None] = []
    link.reachability.on_recovery = lambda: recoveries.append(None)
    try:
        with pytest.raises(RedisUnavailable):
            await link.call(lambda: link.client.ping())
        paused = asyncio.create_task(link.reachability.pause(3600))  # a loop backing off
        await asyncio.sleep(0)  # let it start waiting

        assert await link.call(lambda: working.ping()) is True

        assert link.reachability.reachable
        assert link.reachability.failures == 0
        assert recoveries == [None]
        await asyncio.wait_for(paused, PATIENCE)  # woken by the recovery, not after its hour
    finally:
        await working.aclose()
        await link.aclose()


@pytest.mark.asyncio
async def test_a_call_failing_with_a_non_redis_error_raises_it_and_leaves_reachability_alone() -> None:
    link, failures = closed_link()

    async def bug() -> None:
        raise KeyError("not a Redis error")

    try:
        with pytest.raises(KeyError):
            await link.call(bug)
        assert link.reachability.reachable
        assert link.reachability.failures == 0
        assert failures == []
    finally:
        await link.aclose()


# -- the heartbeat ---------------------------------------------------------------------------------


async def beat_until(parts: Parts, condition: Callable[[], object], what: str) -> None:
    """Run one beat until `condition` holds. `beat()` ends with its pacing sleep (a third of the lease),
    so it is cancelled there rather than awaited."""
    beat = asyncio.create_task(parts.heartbeat.beat())
    try:
        await eventually(condition, what)
    finally:
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_beat_renews_the_lease_of_a_running_job(target: Target, make_parts: MakeParts) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held}, lease=30.0)
    q = target.driver()
    job_id = q.enqueue("t").id
    parts.attempts.start(q.keys, q.lease_one(lease_ms=5_000))
    await eventually(lambda: held.started == [job_id], "the handler to start")
    before = q.redis.zscore(q.keys.active, job_id)
    assert before is not None

    await beat_until(parts, lambda: parts.sample("jobcar_leases_renewed_total", queue="default") == 1, "a renewal")

    after = q.redis.zscore(q.keys.active, job_id)
    assert after is not None
    assert after - before >= 25_000, "the deadline is now 30 s after the beat, not 5 s"
    assert parts.running_ids() == [job_id]
    assert held.cancelled == []


@pytest.mark.asyncio
async def test_a_beat_refreshes_the_alive_key_of_a_one_queue_daemon(target: Target, make_parts: MakeParts) -> None:
    parts = await make_parts(target, lease=30.0)
    alive = parts.leaser.alive
    assert alive is not None
    assert not alive.surely_exists()

    await beat_until(parts, alive.surely_exists, "the alive key")

    assert 0 < target.redis.pttl(alive.key) <= 20_000, "it lapses two thirds into a lease"


@pytest.mark.asyncio
async def test_a_beat_stops_an_attempt_whose_lease_was_lost(target: Target, make_parts: MakeParts) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held})
    q = target.driver()
    job_id = q.enqueue("t").id
    parts.attempts.start(q.keys, q.lease_one())
    await eventually(lambda: held.started == [job_id], "the handler to start")
    running = parts.attempts.running[("default", job_id)]
    q.redis.hset(q.keys.job(job_id), "token", "another-daemons-token")  # reaped and leased again elsewhere

    await beat_until(parts, lambda: held.cancelled, "the attempt to be stopped")
    await parts.settle()

    assert running.stop_reason is StopReason.LEASE_LOST
    assert held.cancelled == [job_id]
    assert parts.attempts.running == {}
    assert parts.sample("jobcar_leases_lost_total", queue="default") == 1
    assert parts.finished() == {}, "a lost lease records nothing: the job is another daemon's"
    assert q.where(job_id) is State.ACTIVE
    assert q.redis.hget(q.keys.job(job_id), "token") == b"another-daemons-token"


@pytest.mark.asyncio
async def test_a_beat_stops_an_attempt_canceled_by_an_operator_and_acks_it_canceled(
    target: Target, make_parts: MakeParts
) -> None:
    held = Held()
    parts = await make_parts(target, {"t": held})
    q = target.driver()
    job_id = q.enqueue("t").id
    parts.attempts.start(q.keys, q.lease_one())
    await eventually(lambda: held.started == [job_id], "the handler to start")
    q.run(cancel_call(q.keys, job_id))

    await beat_until(parts, lambda: held.cancelled, "the attempt to be stopped")
    await parts.settle()

    assert held.cancelled == [job_id]
    assert q.where(job_id) is None, "acked canceled; result_ttl 0 deletes it"
    assert parts.finished() == {"canceled": 1}


async def test_the_settler_carries_every_queue_past_one_whose_settled_list_is_of_another_type(
    any_target: Target, make_parts: MakeParts
) -> None:
    parts = await make_parts(any_target, queues={"a": 1, "b": 1})
    a, b = any_target.driver("a"), any_target.driver("b")
    waiting = a.enqueue("t", after=[("b", b.enqueue("t").id)])  # told through b's settled list
    a.redis.set(a.keys.settled, "not a list")  # sorted first: the settler looks at "a" before "b"
    leased = b.lease_one()
    assert b.ack(leased.job.id, leased.token) == 2
    await parts.runner.settler.step()  # a's list is refused (logged, fsck's to report); b's is carried
    assert a.where(waiting.id) is State.PENDING
    assert not b.redis.exists(b.keys.settled)


@pytest.mark.asyncio
async def test_collecting_leases_at_a_drain_leaves_no_error_unread_when_a_wake_is_still_on_its_way(
    target: Target, make_parts: MakeParts
) -> None:
    """A wake whose reply has not come when the leases have is cancelled; nothing may be left for the garbage
    collector to log as "exception was never retrieved" (a traceback in a JSON log)."""
    parts = await make_parts(target)
    loop = asyncio.get_running_loop()
    unread: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unread.append(context))
    (queue,) = parts.leaser.queues
    queue.reserved = 1  # as if a lease waited behind the watcher's BLMOVE
    collecting = asyncio.create_task(parts.leaser.collect_leases_on_wake())
    await asyncio.sleep(0)  # it sends the wake and waits for the lease's reply
    queue.reserved = 0  # the lease's reply comes before the wake's
    parts.leaser.changed.set()
    await collecting
    gc.collect()
    await asyncio.sleep(0)
    assert unread == []


@pytest.mark.asyncio
async def test_a_wake_list_of_another_type_is_logged_naming_it(
    target: Target, make_parts: MakeParts, caplog: pytest.LogCaptureFixture
) -> None:
    """The idle wait's own BLMOVE (sent without a lease behind it, as while draining) names the key in the
    refusal the daemon logs, as the scripts' refusals do."""
    parts = await make_parts(target)
    (queue,) = parts.leaser.queues
    q = target.driver()
    q.redis.set(q.keys.wake, "written by something else")
    parts.runner.drain()  # no lease rides on the wait
    queue.went_idle.set()
    with caplog.at_level(logging.WARNING):
        await parts.leaser.watch(queue)
    refusals = [r.getMessage() for r in caplog.records if "WRONGTYPE" in r.getMessage()]
    assert refusals, caplog.text
    assert all(f"{q.keys.wake} holds another type, not a list" in line for line in refusals), refusals
