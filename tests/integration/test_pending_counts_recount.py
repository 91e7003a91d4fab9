"""lua/recount_pending.lua, on standalone and Cluster: a queue's pending counts rebuilt from its pending and held
lists and its job hashes, whatever the counts held before, each id once, corrupt keys passed over.

The counts are compared after a recount with the truth the test wrote: what the scripts kept before (or not)
does not matter here."""

from __future__ import annotations

import pytest
import redis

from jobcar.fsck.recount import Recount, parse_recount, recount_call
from tests.integration.driver import QueueDriver
from tests.integration.test_limits import held, lease, rules


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def recount(q: QueueDriver) -> Recount:
    return parse_recount(q.run(recount_call(q.keys)))


def stored(q: QueueDriver) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in q.redis.hgetall(q.keys.pending_counts).items()}


def job(q: QueueDriver, job_id: str, state: str, job_type: str | None = "email") -> None:
    """A job hash written by hand: only what the recount reads."""
    q.redis.hset(q.keys.job(job_id), mapping={"state": state, **({} if job_type is None else {"type": job_type})})


def hold(q: QueueDriver, group: str, *ids: str) -> None:
    """Ids in a limit group's held list, the group indexed."""
    q.redis.lpush(q.keys.held(group), *ids)
    q.redis.sadd(q.keys.limit_groups, group)


def test_each_pending_or_held_job_is_counted_once_by_its_type(q: QueueDriver) -> None:
    pending, priority_3, released = q.keys.pending, q.keys.pending_lists[3], q.keys.released
    job(q, "e1", "pending")
    job(q, "e2", "pending")
    q.redis.lpush(pending, "e1", "e2", "e1")  # e1 twice
    q.redis.lpush(priority_3, "e2")  # and e2 in two lists
    job(q, "s1", "held", "sms")
    job(q, "s2", "pending", "sms")  # let go to pending:released, still in its group's held list (the lease drops it)
    hold(q, "sms#k", "s1", "s2")
    q.redis.lpush(released, "s2")
    job(q, "untyped", "pending", None)
    q.redis.lpush(pending, "untyped")
    # Not counted: no hash, a hash of another type, a hash in another state, a held list of an unindexed group.
    q.redis.lpush(pending, "ghost")
    q.redis.set(q.keys.job("string"), "not a hash")
    q.redis.lpush(priority_3, "string")
    job(q, "active", "active")
    job(q, "dead", "dead", "sms")
    q.redis.lpush(released, "active", "dead")
    job(q, "unindexed", "held", "sms")
    q.redis.lpush(q.keys.held("sms#other"), "unindexed")
    truth = {"email": 2, "sms": 2, "": 1}

    assert recount(q) == Recount(True, truth)
    assert stored(q) == {job_type: str(n) for job_type, n in truth.items()}
    before = q.snapshot()
    assert recount(q) == Recount(False, truth), "right already: nothing to change"
    assert q.snapshot() == before


@pytest.mark.parametrize(
    "counts",
    [{"email": "5"}, {"email": "1"}, {}, {"email": "2", "gone": "3"}, {"email": "two"}, {"email": "02"}],
    ids=["too high", "too low", "missing", "a type more", "not a number", "not as written"],
)
def test_wrong_counts_are_replaced_by_the_true_ones(q: QueueDriver, counts: dict[str, str]) -> None:
    for job_id in ("e1", "e2"):
        job(q, job_id, "pending")
        q.redis.lpush(q.keys.pending, job_id)
    if counts:
        q.redis.hset(q.keys.pending_counts, mapping=counts)
    assert recount(q) == Recount(True, {"email": 2})
    assert stored(q) == {"email": "2"}


def test_counts_of_a_queue_with_nothing_pending_are_deleted(q: QueueDriver) -> None:
    q.redis.hset(q.keys.pending_counts, mapping={"email": "3"})
    assert recount(q) == Recount(True, {})
    assert not q.redis.exists(q.keys.pending_counts)
    assert recount(q) == Recount(False, {})
    assert not q.redis.exists(q.keys.pending_counts), "no write of an empty hash"


def test_counts_of_another_type_are_replaced(q: QueueDriver) -> None:
    job(q, "e1", "pending")
    q.redis.lpush(q.keys.pending, "e1")
    q.redis.set(q.keys.pending_counts, "written by something else")
    assert recount(q) == Recount(True, {"email": 1})
    assert stored(q) == {"email": "1"}


def test_lists_of_another_type_hold_nothing(q: QueueDriver) -> None:
    job(q, "e1", "pending")
    q.redis.lpush(q.keys.pending, "e1")
    q.redis.set(q.keys.pending_lists[2], "not a list")
    job(q, "s1", "held", "sms")
    q.redis.sadd(q.keys.limit_groups, "sms", "sms#k")
    q.redis.set(q.keys.held("sms"), "not a list")
    q.redis.lpush(q.keys.held("sms#k"), "s1")
    assert recount(q) == Recount(True, {"email": 1, "sms": 1}), "the other group's list still counts"

    q.redis.delete(q.keys.limit_groups)
    q.redis.hset(q.keys.limit_groups, "sms#k", "not a set")
    assert recount(q) == Recount(True, {"email": 1}), "no group named: no held list read"


def test_jobs_the_scripts_made_pending_and_held_are_counted(q: QueueDriver) -> None:
    """Jobs as the producer and the lease leave them: pending of two priorities, held by a limit, leased (not
    counted), scheduled (not counted)."""
    limits = rules(a={"total": 1})
    a = [q.enqueue("a", n).id for n in range(3)]
    assert lease(q, limits, count=1) == [a[0]]
    assert lease(q, limits, count=1) == [], "its total is taken: the lease holds the others"
    assert held(q, "a") == a[1:]
    q.enqueue("a", "pending")
    q.enqueue("b", 1)
    q.enqueue("b", 2, priority=7)
    q.enqueue("b", 3, delay=3600)
    assert recount(q).counts == {"a": 3, "b": 2}
    assert stored(q) == {"a": "3", "b": "2"}
