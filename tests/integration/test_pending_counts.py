"""`<prefix>pending_counts`, the jobs of each type pending or held in a queue, which the backpressure bounds read
(ADR 0024), stays exact through every transition: after each step of a random run of enqueues (priorities,
delays, deadlines, dependencies), leases under fleet-wide limits (jobs held and let go), acks, retries, kills,
expired leases reaped, cancels one by one and in bulk, requeues and settled dependencies, the hash equals what
the lists and the job hashes hold. Against the real server, no mocks."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import redis

from jobcar.errors import QueueFull
from jobcar.job import State
from jobcar.keys import QueueKeys
from jobcar.settler import settle_calls_of
from jobcar.transitions import (
    DeadLetterLimits,
    cancel_call,
    cancel_many_call,
    requeue_call,
)
from tests.integration.driver import QueueDriver

#: Type a: two at once fleet-wide; b: one per key; c: no limit.
LIMITS = json.dumps({"a": {"total": 2}, "b": {"per_key": 1, "key": "key"}})
TYPES = ("a", "b", "c")


def truth(r: redis.Redis, keys: QueueKeys) -> dict[str, int]:
    """The jobs of each type whose id is in a pending or held list and whose hash says pending or held."""
    ids: set[bytes] = set()
    for list_key in keys.pending_lists:
        ids.update(r.lrange(list_key, 0, -1))
    for group in r.smembers(keys.limit_groups):
        ids.update(r.lrange(keys.held(group.decode()), 0, -1))
    counts: Counter[str] = Counter()
    for job_id in ids:
        state, job_type = r.hmget(keys.job(job_id.decode()), "state", "type")
        if state in (b"pending", b"held"):
            counts[(job_type or b"").decode()] += 1
    return dict(counts)


def stored(r: redis.Redis, keys: QueueKeys) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(keys.pending_counts).items()}


def ids_in(r: redis.Redis, key: str) -> list[str]:
    return [x.decode() for x in r.zrange(key, 0, -1)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counts_follow_every_transition(r: redis.Redis, namespace: str, seed: int) -> None:
    rng = random.Random(seed)
    q = QueueDriver(r, namespace)
    keys = q.keys
    dead = DeadLetterLimits()
    made: list[str] = []
    steps: Counter[str] = Counter()

    def enqueue() -> None:
        job_id = f"j{len(made)}"
        options: dict[str, object] = {"job_id": job_id, "key": rng.choice(["k1", "k2"])}
        roll = rng.random()
        if roll < 0.2:
            options["priority"] = rng.choice([3, 9])
        elif roll < 0.3:
            options["delay"] = 0.001  # due at once: the next lease promotes it
        elif roll < 0.35:
            options["expires_in"] = 0.001  # never started in time: the next lease moves it to the dead set
        elif roll < 0.45 and made:
            options["after"] = [rng.choice(made)]
        q.enqueue(rng.choice(TYPES), {"n": len(made)}, **options)
        made.append(job_id)

    def lease() -> None:
        q.lease(count=rng.randint(1, 4), lease_ms=rng.choice([1, 30_000]), limits=LIMITS)

    def finish() -> None:
        active = ids_in(r, keys.active)
        if not active:
            return
        job_id = rng.choice(active)
        token = q.token(job_id)
        roll = rng.random()
        if roll < 0.5:
            q.ack(job_id, token)
        elif roll < 0.7:
            q.retry(job_id, token, delay_ms=rng.choice([0, 1]))
        elif roll < 0.8:
            q.retry(job_id, token, spend=False)
        else:
            q.kill(job_id, token)

    def reap() -> None:
        q.reap(limits=LIMITS)

    def cancel() -> None:
        if made:
            q.run(cancel_call(keys, rng.choice(made)))

    def cancel_many() -> None:
        state = rng.choice([State.PENDING, State.HELD, State.SCHEDULED, State.WAITING])
        q.run(cancel_many_call(keys, state, [(rng.choice(made), -1) for _ in range(3)] if made else []))

    def requeue() -> None:
        q.run(requeue_call(keys))

    def settle() -> None:
        for entry in r.lrange(keys.settled, 0, -1):
            for c in settle_calls_of(keys, entry, dead):
                q.run(c)
            r.lrem(keys.settled, 1, entry)

    actions = [enqueue] * 6 + [lease] * 4 + [finish] * 4 + [reap, cancel, cancel_many, requeue, settle, settle]
    for step in range(400):
        action = rng.choice(actions)
        action()
        steps[action.__name__] += 1
        assert stored(r, keys) == truth(r, keys), f"after step {step}, {action.__name__}"
    # Every job ends: what is left runs, is acked, and no count remains.
    for _ in range(2000):
        settle()
        lease()
        for job_id in ids_in(r, keys.active):
            q.ack(job_id, q.token(job_id))
        q.reap(limits=LIMITS)
        if not truth(r, keys) and not r.zcard(keys.scheduled) and not r.llen(keys.settled):
            break
    assert stored(r, keys) == truth(r, keys) == {}
    assert min(steps.values()) > 5, f"every kind of step ran: {steps}"


def test_a_job_its_limit_cannot_hold_leaves_the_count(r: redis.Redis, namespace: str) -> None:
    """A held list of another type (fsck repairs it) cannot take a job over its limit: the lease moves the job to
    the dead set, and out of the count."""
    q = QueueDriver(r, namespace)
    limits = json.dumps({"a": {"total": 1}})
    r.set(q.keys.held("a"), "not a list")
    for n in range(3):
        q.enqueue("a", job_id=f"a{n}")
    assert stored(r, q.keys) == {"a": 3}
    leased = q.lease(count=3, limits=limits)
    assert [leased_job.job.id for leased_job in leased.jobs] == ["a0"]
    assert {why for _, why in leased.dropped} == {
        f"its limit group a cannot hold it: {q.keys.held('a')} holds a "
        "string, not a list (jobcar fsck finds it and repairs it); moved "
        "to the dead set"
    }
    assert stored(r, q.keys) == truth(r, q.keys) == {}


def test_a_type_bound_refuses_only_its_type_and_names_it(r: redis.Redis, namespace: str) -> None:
    q = QueueDriver(r, namespace)
    r.hset(q.keys.settings, "max_pending:email", 2)
    q.enqueue("email", job_id="e1")
    q.enqueue("email", job_id="e2", delay=3600)  # a job of any state is one new job; scheduled ones do not count
    with pytest.raises(QueueFull) as full:
        q.producer.enqueue_many([("report", {}, {"job_id": "r1"}), ("email", {}, {"job_id": "e3"}),
                                 ("email", {}, {"job_id": "e4"})])  # fmt: skip
    refusal = full.value
    assert (refusal.job_type, refusal.pending, refusal.max_pending, refusal.refused) == ("email", 1, 2, 2)
    assert "1 pending of type email, max_pending 2; 2 jobs refused" in str(refusal)
    assert q.job("r1") is None, "the call is refused whole, its other types too"
    q.enqueue("email", job_id="e3")  # up to the bound exactly
    for n in range(5):
        q.enqueue("report", job_id=f"r{n}")  # no bound of its own, none of the queue
    assert stored(r, q.keys) == {"email": 2, "report": 5}
    q.lease(count=6)  # FIFO: e1, e3 and four reports leave the count
    assert stored(r, q.keys) == {"report": 1}
    q.enqueue("email", job_id="e5")


def test_held_jobs_count_toward_the_queue_bound(r: redis.Redis, namespace: str) -> None:
    """A limit holds jobs out of the pending lists; they still wait to run, and the bound counts them."""
    q = QueueDriver(r, namespace)
    limits = json.dumps({"a": {"total": 1}})
    for n in range(3):
        q.enqueue("a", job_id=f"a{n}")
    leased = q.lease(count=3, limits=limits)
    assert len(leased.jobs) == 1
    assert [r.hget(q.keys.job(f"a{n}"), "state") for n in (1, 2)] == [b"held", b"held"]
    assert r.llen(q.keys.pending) == 0
    r.hset(q.keys.settings, "max_pending", 3)
    q.enqueue("b", job_id="b0")
    with pytest.raises(QueueFull) as full:
        q.enqueue("b", job_id="b1")
    assert (full.value.job_type, full.value.pending, full.value.max_pending) == (None, 3, 3)
    q.ack(leased.jobs[0].job.id, leased.jobs[0].token)  # a1 let go: still waiting, still counted
    with pytest.raises(QueueFull):
        q.enqueue("b", job_id="b1")
    q.lease(count=1, limits=limits)
    q.enqueue("b", job_id="b1")
    assert stored(r, q.keys) == truth(r, q.keys) == {"a": 1, "b": 2}
