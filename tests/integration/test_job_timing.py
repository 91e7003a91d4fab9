"""Per-job priority, start deadlines, unique windows and debounce, as transitions, on standalone and Cluster."""

from __future__ import annotations

import time

import pytest
import redis

from jobcar import EnqueueStatus, State
from jobcar.scripts import call
from jobcar.transitions import CancelResult, cancel_call, parse_cancel, parse_stats, requeue_call, stats_call
from tests.integration.driver import QueueDriver
from tests.servers import wait_for


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def leased_ids(q: QueueDriver, count: int = 100) -> list[str]:
    return [leased.job.id for leased in q.lease(count=count).jobs]


def promote_due(q: QueueDriver) -> None:
    """Wait until every scheduled job is due and promoted (a lease of none still promotes)."""
    wait_for(lambda: q.lease(count=0).next_due_ms is None, timeout=10, what="the scheduled jobs to be promoted")


# -- priority ---------------------------------------------------------------------------------------


def test_pending_jobs_are_leased_by_priority_then_fifo_within_one(q: QueueDriver) -> None:
    order = [5, 0, 9, 5, 1, 0, 9]
    ids = [q.enqueue(payload=n, priority=p).id for n, p in enumerate(order)]
    by_priority = [ids[n] for n in sorted(range(len(order)), key=lambda n: (order[n], n))]
    assert [q.job(i).priority for i in ids] == order  # type: ignore[union-attr]
    assert parse_stats(q.keys, q.run(stats_call(q.keys))).pending == len(order)
    # Three at a time: a lease that spans priorities keeps the order too.
    assert leased_ids(q, 3) + leased_ids(q, 3) + leased_ids(q, 3) == by_priority
    assert not q.redis.exists(q.keys.wake), "nothing is pending at any priority: idle daemons may block"


def test_a_job_keeps_its_priority_through_delay_retry_and_requeue(q: QueueDriver) -> None:
    low = q.enqueue(payload="low", priority=7, delay=0.05).id
    promote_due(q)
    first = q.enqueue(payload="first").id
    assert leased_ids(q) == [first, low], "promoted into its own priority's list, behind priority 0"
    assert q.retry(low, q.token(low), delay_ms=0) == 1
    again = q.enqueue(payload="again").id
    assert leased_ids(q) == [again, low], "a retry waits behind priority-0 work again"
    q.kill(low, q.token(low))
    assert q.run(requeue_call(q.keys, [low])) == 1
    assert q.where(low) is State.PENDING
    assert q.redis.llen(q.keys.pending_lists[7]) == 1


def test_a_waiting_job_of_any_priority_can_be_canceled(q: QueueDriver) -> None:
    job = q.enqueue(priority=3).id
    assert q.where(job) is State.PENDING
    assert parse_cancel(q.run(cancel_call(q.keys, job))) == (CancelResult.CANCELED, State.PENDING)
    assert q.sets_of(job) == []
    assert q.job(job) is None


def test_the_script_refuses_a_priority_out_of_range(q: QueueDriver) -> None:
    record = ["id1", "t", "null", 0, 0, "", 0, 1, "priority", "10"]
    enqueue = call("enqueue", (q.keys.pending, q.keys.scheduled, q.keys.wake), [q.keys.prefix, *record])
    with pytest.raises(redis.ResponseError, match="priority must be a whole number from 0 to 9"):
        q.run(enqueue)


def test_a_priority_list_of_another_type_is_passed_over_not_fatal(q: QueueDriver) -> None:
    q.redis.set(q.keys.pending_lists[4], "not a list")
    job = q.enqueue(priority=4).id
    assert leased_ids(q) == [job], "it waited in the default list instead"


# -- start deadlines --------------------------------------------------------------------------------


def test_a_job_not_started_by_its_deadline_dies_expired_and_is_never_leased(q: QueueDriver) -> None:
    late = q.enqueue(payload="late", expires_at=time.time() - 1).id
    soon = q.enqueue(payload="soon", expires_in=0.05).id
    fine = q.enqueue(payload="fine", expires_in=3600).id
    wait_for(lambda: q.now_ms() > q.job(soon).expires_at_ms, timeout=5)  # type: ignore[union-attr]
    result = q.lease()
    assert [j.job.id for j in result.jobs] == [fine]
    assert sorted(result.expired) == sorted([late, soon])
    for job_id in (late, soon):
        job = q.job(job_id)
        assert job is not None
        assert q.where(job_id) is State.DEAD
        assert job.last_error is not None
        assert job.last_error.startswith("expired: not started by its deadline")


def test_a_deadline_counts_until_the_first_start_only(q: QueueDriver) -> None:
    job = q.enqueue(expires_in=0.2).id
    assert leased_ids(q) == [job]
    wait_for(lambda: q.now_ms() > q.job(job).expires_at_ms, timeout=5)  # type: ignore[union-attr]
    assert q.retry(job, q.token(job), delay_ms=0) == 1
    assert leased_ids(q) == [job], "a job that started once is retried whatever the time"


# -- unique keys: until done, or for a whole window -------------------------------------------------


def test_until_done_frees_the_key_when_the_job_ends_and_a_window_does_not(q: QueueDriver) -> None:
    held = q.enqueue(payload=1, unique_key="k", unique_for=60).id
    window = q.enqueue(payload=1, unique_key="k", unique_for=60, unique_mode="window").id
    assert window != held, "the two modes keep separate keys"
    for job_id in leased_ids(q):
        assert q.ack(job_id, q.token(job_id)) == 1
    assert q.enqueue(payload=2, unique_key="k", unique_for=60).status is EnqueueStatus.CREATED
    again = q.enqueue(payload=2, unique_key="k", unique_for=60, unique_mode="window")
    assert (again.status, again.id, again.state) == (EnqueueStatus.DUPLICATE, window, State.DONE)
    assert 0 < q.redis.pttl(q.keys.window("k")) <= 60_000


def test_a_window_ends_with_its_ttl(q: QueueDriver) -> None:
    first = q.enqueue(unique_key="w", unique_for=0.1, unique_mode="window").id
    wait_for(lambda: not q.redis.exists(q.keys.window("w")), timeout=5, what="the window to end")
    second = q.enqueue(unique_key="w", unique_for=0.1, unique_mode="window")
    assert second.created
    assert second.id != first


# -- debounce ---------------------------------------------------------------------------------------


def test_debounce_keeps_one_waiting_job_with_the_last_payload_and_a_later_run_time(q: QueueDriver) -> None:
    first = q.enqueue(payload=1, debounce=30, debounce_key="user-7", debounce_max_wait=60)
    assert first.created
    assert first.state is State.SCHEDULED
    run_at = q.job(first.id).run_at_ms  # type: ignore[union-attr]
    second = q.enqueue(payload=2, debounce=30, debounce_key="user-7", debounce_max_wait=60)
    other = q.enqueue(payload=3, debounce=30, debounce_key="user-8")
    assert (second.status, second.id, second.state) == (EnqueueStatus.DEBOUNCED, first.id, State.SCHEDULED)
    assert other.created, "another key is another stream"
    assert other.id != first.id
    job = q.job(first.id)
    assert job is not None
    assert job.payload == b"2"
    assert job.run_at_ms is not None
    assert job.run_at_ms >= run_at
    assert q.redis.zscore(q.keys.scheduled, first.id) == job.run_at_ms
    assert q.sets_of(first.id) == [State.SCHEDULED]


def test_debounce_never_pushes_a_job_past_its_max_wait(q: QueueDriver) -> None:
    first = q.enqueue(payload=0, debounce=30, debounce_max_wait=30.5)
    created = q.job(first.id).created_ms  # type: ignore[union-attr]
    wait_for(lambda: q.now_ms() > created + 600, timeout=5)
    pushed = q.enqueue(payload=1, debounce=30, debounce_max_wait=30.5)
    assert pushed.status is EnqueueStatus.DEBOUNCED
    assert q.job(first.id).run_at_ms == created + 30_500  # type: ignore[union-attr]


def test_a_debounced_job_that_started_takes_no_more_payloads(q: QueueDriver) -> None:
    first = q.enqueue(payload=1, debounce=0.05).id
    promote_due(q)
    assert leased_ids(q) == [first]
    second = q.enqueue(payload=2, debounce=0.05)
    assert second.created
    assert second.id != first
