"""Every transition of the state machine, against a standalone server and against a Redis Cluster."""

from __future__ import annotations

import json

import pytest
import redis

from jobcar import EnqueueStatus, State, replies, transitions, transport
from jobcar.keys import queues_key
from jobcar.scripts import ScriptCall, script
from jobcar.transitions import CancelResult, ExtendStatus, RetryResult
from tests.integration.driver import QueueDriver
from tests.servers import wait_for


@pytest.fixture
def q(any_redis: redis.Redis | redis.RedisCluster, namespace: str) -> QueueDriver:
    return QueueDriver(any_redis, namespace)


def cancel(q: QueueDriver, job_id: str) -> tuple[CancelResult, State | None]:
    return transitions.parse_cancel(q.run(transitions.cancel_call(q.keys, job_id)))


def test_enqueue_stores_a_pending_job_with_its_fields(q: QueueDriver) -> None:
    info = q.enqueue("email.welcome", {"user": 42}, max_attempts=4, timeout=10, meta={"tenant": "a"})
    assert info.status is EnqueueStatus.CREATED
    assert info.state is State.PENDING
    assert info.queue == "default"
    job = q.job(info.id)
    assert job is not None
    assert (job.type, job.payload, job.max_attempts, job.timeout_ms) == ("email.welcome", b'{"user":42}', 4, 10_000)
    assert job.meta == {"tenant": "a"}
    assert job.attempt == 0
    assert job.content_type == "application/json"
    assert q.where(info.id) is State.PENDING
    assert q.redis.exists(q.keys.wake) == 1, "an enqueue must wake blocked daemons"
    assert q.redis.smembers(queues_key(q.keys.namespace)) == {b"default"}


def test_wake_stays_while_jobs_are_pending_and_goes_with_the_last_one(q: QueueDriver) -> None:
    """A daemon that leased the last pending job blocks on wake next: it must be gone, or the daemon's
    wait would return at once for one more lease that finds nothing."""
    for _ in range(3):
        q.enqueue("t")
    assert len(q.lease(2).jobs) == 2
    assert q.redis.exists(q.keys.wake) == 1, "one job is still pending"
    assert len(q.lease(2).jobs) == 1
    assert q.redis.exists(q.keys.wake) == 0, "the lease that emptied pending clears wake"


def test_a_lease_given_an_alive_key_takes_jobs_only_while_the_key_exists(q: QueueDriver) -> None:
    """The lease a daemon queues behind its idle wait (ADR 0005) carries the daemon's alive key: once
    the key has lapsed (the daemon froze), the lease takes nothing and changes nothing."""
    info = q.enqueue("t")
    q.enqueue("later", delay=60)
    alive = q.keys.alive("d1")
    call = transitions.lease_call(q.keys, 10, 30_000, 3, alive_key=alive)
    before = {key: q.redis.dump(key) for key in (q.keys.pending, q.keys.wake, q.keys.job(info.id))}
    declined = transitions.parse_lease(q.keys, q.run(call))
    assert declined.declined
    assert declined.jobs == []
    assert not declined.paused
    assert declined.next_due_ms is not None
    assert 59_000 < declined.next_due_ms <= 60_000
    assert {key: q.redis.dump(key) for key in before} == before, "a declined lease changes nothing"
    q.redis.set(alive, "1", px=10_000)
    leased = transitions.parse_lease(q.keys, q.run(call))
    assert not leased.declined
    assert [j.job.id for j in leased.jobs] == [info.id]


def test_raw_bytes_payload_keeps_its_bytes_and_content_type(q: QueueDriver) -> None:
    raw = b"\x00\xff\xfe; $(rm -rf /) `id`\n"
    info = q.enqueue("blob", raw, content_type="application/x-thing")
    job = q.lease_one().job
    assert job.id == info.id
    assert job.payload == raw
    assert job.content_type == "application/x-thing"


def test_delayed_job_waits_in_scheduled_then_is_promoted_when_due(q: QueueDriver) -> None:
    info = q.enqueue("later", delay=0.3)
    assert info.state is State.SCHEDULED
    assert q.where(info.id) is State.SCHEDULED
    early = q.lease()
    assert early.jobs == []
    assert early.next_due_ms is not None
    assert 0 < early.next_due_ms <= 300
    assert q.redis.exists(q.keys.wake) == 0, "a lease that finds nothing clears wake so the daemon can block"
    leased: list[transitions.LeasedJob] = []
    wait_for(lambda: leased.extend(q.lease().jobs) or leased, what="the delayed job to become due")
    assert leased[0].job.id == info.id
    assert leased[0].job.run_at_ms is not None
    assert leased[0].job.started_ms is not None
    assert leased[0].job.started_ms >= leased[0].job.run_at_ms


def test_run_at_in_the_past_is_runnable_now(q: QueueDriver) -> None:
    assert q.enqueue("t", run_at=1_000_000.0).state is State.PENDING


def test_caller_chosen_id_is_add_if_absent(q: QueueDriver) -> None:
    first = q.enqueue("order.ship", {"v": 1}, job_id="order-17")
    again = q.enqueue("order.ship", {"v": 2}, job_id="order-17")
    assert first.status is EnqueueStatus.CREATED
    assert (again.status, again.id, again.state) == (EnqueueStatus.EXISTS, "order-17", State.PENDING)
    job = q.job("order-17")
    assert job is not None
    assert job.payload == b'{"v":1}'
    assert q.redis.llen(q.keys.pending) == 1


def test_unique_key_admits_one_job_until_it_finishes(q: QueueDriver) -> None:
    first = q.enqueue("sync", {"a": 1}, unique_key="acct-1", unique_for=60)
    dup = q.enqueue("sync", {"a": 2}, unique_key="acct-1", unique_for=60)
    assert (dup.status, dup.id, dup.state) == (EnqueueStatus.DUPLICATE, first.id, State.PENDING)
    assert 59_000 < q.redis.pttl(q.keys.unique("acct-1")) <= 60_000
    leased = q.lease_one()
    assert q.enqueue("sync", unique_key="acct-1", unique_for=60).state is State.ACTIVE
    assert q.ack(leased.job.id, leased.token) == 1
    assert q.redis.exists(q.keys.unique("acct-1")) == 0, "success releases the lock"
    assert q.enqueue("sync", unique_key="acct-1", unique_for=60).status is EnqueueStatus.CREATED


def test_unique_for_without_key_dedups_same_type_and_payload(q: QueueDriver) -> None:
    a = q.enqueue("report", {"day": 1}, unique_for=60)
    assert q.enqueue("report", {"day": 1}, unique_for=60).status is EnqueueStatus.DUPLICATE
    assert q.enqueue("report", {"day": 2}, unique_for=60).status is EnqueueStatus.CREATED
    assert a.created


def test_lease_takes_fifo_up_to_n_with_fresh_tokens_and_counts_the_attempt(q: QueueDriver) -> None:
    ids = [q.enqueue("t", n).id for n in range(5)]
    result = q.lease(count=2, lease_ms=10_000, max_attempts=7)
    assert [j.job.id for j in result.jobs] == ids[:2]
    assert result.next_due_ms is None
    assert not result.paused
    assert result.dropped == []
    assert len({j.token for j in result.jobs}) == 2
    for leased in result.jobs:
        assert leased.job.attempt == 1
        assert leased.job.state is State.ACTIVE
        assert leased.job.max_attempts == 7, "the daemon's default is stored when the job has none"
        assert leased.job.token == leased.token
        deadline = q.redis.zscore(q.keys.active, leased.job.id)
        assert deadline is not None
        assert deadline - result.now_ms == 10_000
    assert q.redis.llen(q.keys.pending) == 3


def test_lease_uses_per_type_max_attempts_but_never_overrides_the_job(q: QueueDriver) -> None:
    typed = q.enqueue("typed").id
    own = q.enqueue("typed", max_attempts=2).id
    jobs = {j.job.id: j.job for j in q.lease(by_type=json.dumps({"typed": 5})).jobs}
    assert jobs[typed].max_attempts == 5
    assert jobs[own].max_attempts == 2


def test_lease_reply_is_the_hash_as_written_and_a_hand_written_attempt_cannot_strand_the_batch(
    q: QueueDriver,
) -> None:
    ids = [q.enqueue("t", n).id for n in range(3)]
    # An attempt that is not a number (written by hand) used to fail the script after its RPOP, losing
    # the popped ids; it now counts as no attempt yet.
    q.redis.hset(q.keys.job(ids[1]), "attempt", "many")
    q.redis.hset(q.keys.job(ids[2]), mapping={"attempt": "4", "max_attempts": "9"})
    result = q.lease(count=3, max_attempts=7)
    assert [j.job.attempt for j in result.jobs] == [1, 1, 5]
    assert [j.job.max_attempts for j in result.jobs] == [7, 7, 9]
    for leased in result.jobs:
        assert leased.job == replies.parse_job(leased.job.id, "default", q.redis.hgetall(q.keys.job(leased.job.id)))
        assert q.redis.zscore(q.keys.active, leased.job.id) is not None


def test_lease_on_an_empty_queue_reports_the_next_due_job(q: QueueDriver) -> None:
    assert q.lease().next_due_ms is None
    q.enqueue("t", delay=60)
    due = q.lease().next_due_ms
    assert due is not None
    assert 59_000 < due <= 60_000


def test_extend_renews_only_the_callers_lease_and_reports_cancel(q: QueueDriver) -> None:
    q.enqueue()
    q.enqueue()
    a, b = q.lease(count=2, lease_ms=5_000).jobs
    before = q.redis.zscore(q.keys.active, a.job.id)
    assert q.extend([(a.job.id, a.token), (b.job.id, "stale")], lease_ms=60_000) == [
        ExtendStatus.RENEWED,
        ExtendStatus.LOST,
    ]
    after = q.redis.zscore(q.keys.active, a.job.id)
    assert before is not None
    assert after is not None
    assert after > before + 50_000
    q.run(transitions.cancel_call(q.keys, b.job.id))
    assert q.extend([(b.job.id, b.token)]) == [ExtendStatus.CANCEL_REQUESTED]


def test_ack_deletes_the_job_or_keeps_its_result(q: QueueDriver) -> None:
    q.enqueue(job_id="plain")
    q.enqueue(job_id="kept")
    leased = {j.job.id: j for j in q.lease().jobs}
    assert q.ack("plain", leased["plain"].token) == 1
    assert q.where("plain") is None
    assert q.redis.exists(q.keys.job("plain")) == 0
    assert q.ack("kept", leased["kept"].token, result=b"42", retention_ms=60_000) == 1
    job = q.job("kept")
    assert job is not None
    assert job.state is State.DONE
    assert job.result == b"42"
    assert job.token is None
    assert 59_000 < q.redis.pttl(q.keys.job("kept")) <= 60_000
    assert q.redis.zcard(q.keys.active) == 0


def test_ack_as_canceled(q: QueueDriver) -> None:
    info = q.enqueue(batch="b1")
    leased = q.lease_one()
    assert q.ack(info.id, leased.token, final=State.CANCELED, retention_ms=1000) == 1
    job = q.job(info.id)
    assert job is not None
    assert job.state is State.CANCELED
    assert q.redis.hgetall(q.keys.batch("b1")) == {b"total": b"1", b"canceled": b"1"}


def test_one_ack_call_finishes_many_jobs_each_by_its_own_lease(q: QueueDriver) -> None:
    for job_id in ("a", "b", "c", "d"):
        q.enqueue(job_id=job_id, batch="b1")
    leased = {j.job.id: j for j in q.lease(count=4).jobs}
    calls = [
        transitions.ack_call(q.keys, "a", leased["a"].token),
        transitions.ack_call(q.keys, "b", "not-the-token"),
        transitions.ack_call(q.keys, "c", leased["c"].token, result=b"r", retention_ms=60_000),
        transitions.ack_call(q.keys, "d", leased["d"].token, final=State.CANCELED, retention_ms=60_000),
    ]
    # coalesce merges them into one script call; split_reply hands each caller its own answer.
    [(merged, positions)] = transitions.coalesce(calls)
    assert positions == [0, 1, 2, 3]
    assert len(merged.keys) == 5
    [reply] = transport.execute(q.redis, [merged])
    assert transitions.split_reply(merged, reply, 4) == [1, 0, 1, 1]
    assert q.where("a") is None
    assert q.where("b") is State.ACTIVE, "a lost lease changes nothing for that job"
    kept, canceled = q.job("c"), q.job("d")
    assert kept is not None
    assert (kept.state, kept.result) == (State.DONE, b"r")
    assert canceled is not None
    assert canceled.state is State.CANCELED
    assert q.redis.hgetall(q.keys.batch("b1")) == {b"total": b"4", b"done": b"2", b"canceled": b"1"}


def test_one_ack_call_keeps_for_its_waiter_only_the_job_someone_waits_for(q: QueueDriver) -> None:
    # The script looks for waiters with one EXISTS over the call's jobs, then reads the waited one's PTTL.
    for job_id in ("a", "b", "c"):
        q.enqueue(job_id=job_id)
    leased = {j.job.id: j for j in q.lease(count=3).jobs}
    q.redis.set(q.keys.waiter("b"), "1", px=60_000)
    merged = transitions.merge_acks([transitions.ack_call(q.keys, i, leased[i].token) for i in ("a", "b", "c")])
    assert q.run(merged) == [1, 1, 1]
    assert q.where("a") is None
    assert q.where("c") is None
    assert q.where("b") is State.DONE
    assert 55_000 < q.redis.pttl(q.keys.job("b")) <= 60_000


def test_coalesce_keeps_other_calls_and_other_queues_apart(q: QueueDriver) -> None:
    other = QueueDriver(q.redis, q.namespace, queue="other").keys
    calls = [
        transitions.ack_call(q.keys, "a", "t1"),
        transitions.ack_call(other, "b", "t2"),
        transitions.ack_call(q.keys, "c", "t3"),
        transitions.extend_call(q.keys, 1000, [("a", "t1")]),
    ]
    sent = transitions.coalesce(calls)
    assert sorted(positions for _, positions in sent) == [[0, 2], [1], [3]]
    with pytest.raises(ValueError, match="one queue"):
        transitions.merge_acks([calls[0], calls[1]])


def test_retry_schedules_the_next_attempt_and_records_the_error(q: QueueDriver) -> None:
    info = q.enqueue()
    leased = q.lease_one()
    assert q.retry(info.id, leased.token, delay_ms=30_000, error="HTTP 500: oops") == RetryResult.RETRIED
    job = q.job(info.id)
    assert job is not None
    assert q.where(info.id) is State.SCHEDULED
    assert job.last_error == "HTTP 500: oops"
    assert job.errors[0].attempt == 1
    assert job.token is None
    score = q.redis.zscore(q.keys.scheduled, info.id)
    assert score is not None
    assert job.run_at_ms == int(score)


def test_retry_without_delay_goes_straight_to_pending(q: QueueDriver) -> None:
    info = q.enqueue()
    assert q.retry(info.id, q.lease_one().token, delay_ms=0) == RetryResult.RETRIED
    assert q.where(info.id) is State.PENDING
    assert q.lease_one().job.attempt == 2


def test_retry_without_spending_gives_the_attempt_back(q: QueueDriver) -> None:
    info = q.enqueue(max_attempts=1)
    for _ in range(3):  # a handler may say "later" (429 + Retry-After) without exhausting the job
        assert q.retry(info.id, q.lease_one().token, spend=False) == RetryResult.RETRIED
    job = q.job(info.id)
    assert job is not None
    assert job.attempt == 0
    assert q.where(info.id) is State.PENDING


def test_giving_attempts_back_is_bounded(q: QueueDriver) -> None:
    info = q.enqueue(max_attempts=1)
    for _ in range(2):
        assert q.retry(info.id, q.lease_one().token, spend=False, max_free=2) == RetryResult.RETRIED
    assert q.retry(info.id, q.lease_one().token, spend=False, max_free=2) == RetryResult.DEAD
    job = q.job(info.id)
    assert job is not None
    assert "attempts exhausted: 1 of 1" in (job.last_error or "")


def test_retry_with_attempts_spent_moves_to_dead(q: QueueDriver) -> None:
    info = q.enqueue(max_attempts=2, unique_for=60)
    assert q.retry(info.id, q.lease_one().token, error="first") == RetryResult.RETRIED
    assert q.retry(info.id, q.lease_one().token, error="second") == RetryResult.DEAD
    job = q.job(info.id)
    assert job is not None
    assert q.where(info.id) is State.DEAD
    assert [e.error for e in job.errors] == ["first", "second (attempts exhausted: 2 of 2)"]
    assert [e.attempt for e in job.errors] == [1, 2]
    assert q.redis.exists(q.keys.unique(job.unique_key or "")) == 0, "death releases the unique lock"


def test_kill_moves_to_dead_with_the_reason(q: QueueDriver) -> None:
    info = q.enqueue("nobody.handles.this")
    assert q.kill(info.id, q.lease_one().token, reason="no handler for type nobody.handles.this") == 1
    job = q.job(info.id)
    assert job is not None
    assert q.where(info.id) is State.DEAD
    assert job.last_error == "no handler for type nobody.handles.this"
    assert job.finished_ms is not None


def test_stale_tokens_are_rejected_with_no_state_change(q: QueueDriver) -> None:
    info = q.enqueue()
    old = q.lease_one(lease_ms=1)
    wait_for(lambda: q.reap(), what="the short lease to expire and be reaped")
    new = q.lease_one()
    assert new.token != old.token
    before = q.snapshot()
    assert q.extend([(info.id, old.token)]) == [ExtendStatus.LOST]
    assert q.ack(info.id, old.token) == 0
    assert q.retry(info.id, old.token) == RetryResult.LOST
    assert q.kill(info.id, old.token) == 0
    assert q.snapshot() == before
    assert q.ack(info.id, new.token) == 1, "the current holder is unaffected"


def test_reap_returns_expired_leases_to_pending_and_spent_ones_to_dead(q: QueueDriver) -> None:
    again = q.enqueue(max_attempts=2).id
    spent = q.enqueue(max_attempts=1).id
    live = q.enqueue().id
    leased = {j.job.id: j for j in q.lease(count=2, lease_ms=1).jobs}
    q.lease_one(lease_ms=60_000)
    reaped: dict[str, str] = {}
    wait_for(lambda: reaped.update(q.reap()) or len(reaped) == 2, what="both short leases to be reaped")
    assert reaped == {again: "pending", spent: "dead"}
    assert q.where(again) is State.PENDING
    assert q.where(spent) is State.DEAD
    assert q.where(live) is State.ACTIVE
    job = q.job(again)
    assert job is not None
    assert job.token is None
    assert "lease expired" in (job.last_error or "")
    assert q.ack(again, leased[again].token) == 0, "the reaped lease is fenced off"
    assert q.lease_one().job.attempt == 2


def test_requeue_from_dead_resets_attempts(q: QueueDriver) -> None:
    ids = [q.enqueue(max_attempts=1).id for _ in range(3)]
    for leased in q.lease().jobs:
        q.kill(leased.job.id, leased.token)
    assert q.run(transitions.requeue_call(q.keys, [ids[0], "not-dead"])) == 1
    assert q.where(ids[0]) is State.PENDING
    assert q.run(transitions.requeue_call(q.keys, limit=1)) == 1
    assert q.run(transitions.requeue_call(q.keys, limit=1)) == 1
    assert q.run(transitions.requeue_call(q.keys, limit=1)) == 0
    for i in ids:
        job = q.job(i)
        assert job is not None
        assert job.attempt == 0
        assert q.where(i) is State.PENDING


def test_purge_deletes_dead_jobs(q: QueueDriver) -> None:
    ids = [q.enqueue().id for _ in range(3)]
    for leased in q.lease().jobs:
        q.kill(leased.job.id, leased.token)
    assert q.run(transitions.purge_call(q.keys, [ids[0]])) == 1
    assert q.run(transitions.purge_call(q.keys)) == 2
    assert all(q.job(i) is None for i in ids)
    assert q.redis.zcard(q.keys.dead) == 0


def test_dead_set_is_trimmed_by_size_and_age(q: QueueDriver) -> None:
    q.dead_limits = transitions.DeadLetterLimits(max_jobs=2, max_age_ms=180 * 86400 * 1000)
    ids = [q.enqueue().id for _ in range(4)]
    for leased in q.lease().jobs:
        # One death per Redis millisecond, so "oldest" is well defined (equal scores sort by id).
        started = _redis_ms(q)
        wait_for(lambda started=started: _redis_ms(q) > started, what="the next Redis millisecond")
        q.kill(leased.job.id, leased.token)
    assert q.redis.zrange(q.keys.dead, 0, -1) == [i.encode() for i in ids[2:]]
    assert q.job(ids[0]) is None, "trimmed jobs' hashes go too"
    assert q.job(ids[1]) is None, "trimmed jobs' hashes go too"
    q.dead_limits = transitions.DeadLetterLimits(max_jobs=100, max_age_ms=1)
    last = q.enqueue().id
    died_at = int(q.redis.zscore(q.keys.dead, ids[3]) or 0)
    wait_for(lambda: _redis_ms(q) > died_at + 1, what="the dead jobs to be older than max_age")
    q.kill(last, q.lease_one().token)
    assert q.redis.zrange(q.keys.dead, 0, -1) == [last.encode()]


def _redis_ms(q: QueueDriver) -> int:
    seconds, micros = q.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_cancel_deletes_waiting_jobs_and_flags_running_ones(q: QueueDriver) -> None:
    pending = q.enqueue(unique_for=60).id
    scheduled = q.enqueue(delay=60, batch="b").id
    assert cancel(q, pending) == (CancelResult.CANCELED, State.PENDING)
    assert q.job(pending) is None
    assert q.redis.llen(q.keys.pending) == 0
    assert q.redis.keys(q.keys.prefix + "unique:*") == []
    assert cancel(q, scheduled) == (CancelResult.CANCELED, State.SCHEDULED)
    assert q.redis.hget(q.keys.batch("b"), "canceled") == b"1"
    running = q.enqueue().id
    leased = q.lease_one()
    result = cancel(q, running)
    assert result == (CancelResult.CANCEL_REQUESTED, State.ACTIVE)
    job = q.job(running)
    assert job is not None
    assert job.cancel_requested
    assert q.where(running) is State.ACTIVE
    q.kill(running, leased.token)
    assert cancel(q, running) == (CancelResult.NOT_CANCELABLE, State.DEAD)
    assert cancel(q, "nope") == (CancelResult.MISSING, None)


def test_cancel_many_deletes_the_jobs_still_in_their_state_and_marks_lists_once(q: QueueDriver) -> None:
    """The bulk cancel's step (Admin.cancel_queue_state): each job still in the state given is deleted as cancel
    deletes one, a pending or held one found at the index given (or looked for when it moved), and lists lose
    exactly those; a job in another state is left as it is."""
    low = [q.enqueue(job_id=f"p{n}", unique_for=60, unique_key=f"u{n}").id for n in range(4)]  # left end: p3
    high = [q.enqueue(job_id=f"h{n}", priority=5, batch="b").id for n in range(3)]
    # pending: p2 at its index 1, p0 at a wrong one (it is looked for), h1 at its index 1 of pending:5.
    located = [("p2", 1), ("p0", 0), ("h1", 1), ("nope", -1)]
    assert transitions.parse_cancel_many(q.run(transitions.cancel_many_call(q.keys, State.PENDING, located))) == (3, 1)
    assert [m.decode() for m in q.redis.lrange(q.keys.pending, 0, -1)] == ["p3", "p1"]
    assert [m.decode() for m in q.redis.lrange(q.keys.pending + ":5", 0, -1)] == ["h2", "h0"]
    assert q.redis.keys(q.keys.prefix + "unique:u[02]") == []
    assert q.redis.hget(q.keys.batch("b"), "canceled") == b"1"
    assert [q.job(i) is None for i in [*low, *high]] == [True, False, True, False, False, True, False]
    # held: three jobs of group "a" behind a running one; the group is kept while a slot is taken.
    q.redis.delete(q.keys.pending, q.keys.pending + ":5")  # the jobs left above are leased no more
    held = [q.enqueue("a", job_id=f"a{n}").id for n in range(4)]
    assert [j.job.id for j in q.lease(limits='{"a": {"total": 1}}').jobs] == held[:1]
    located = [("a3", 0), ("a2", 1), ("a1", 2), ("a0", -1)]  # a0 runs: left as it is
    assert transitions.parse_cancel_many(q.run(transitions.cancel_many_call(q.keys, State.HELD, located))) == (3, 1)
    assert q.redis.exists(q.keys.held("a")) == 0
    assert q.redis.smembers(q.keys.limit_groups) == {b"a"}
    assert q.where(held[0]) is State.ACTIVE
    # scheduled: a job promoted meanwhile is pending, not canceled.
    later = q.enqueue(job_id="s0", delay=60).id
    assert transitions.parse_cancel_many(q.run(transitions.cancel_many_call(q.keys, State.PENDING, [(later, 0)]))) == (
        0,
        1,
    )
    assert transitions.parse_cancel_many(
        q.run(transitions.cancel_many_call(q.keys, State.SCHEDULED, [(later, -1)]))
    ) == (1, 0)
    assert q.redis.zcard(q.keys.scheduled) == 0


def test_pause_stops_leasing_and_resume_wakes(q: QueueDriver) -> None:
    info = q.enqueue()
    assert q.run(transitions.pause_call(q.keys, True)) == 1
    assert q.run(transitions.pause_call(q.keys, True)) == 0
    paused = q.lease()
    assert paused.paused
    assert paused.jobs == []
    assert q.redis.exists(q.keys.wake) == 0
    q.enqueue()
    assert q.run(transitions.pause_call(q.keys, False)) == 1
    assert q.redis.exists(q.keys.wake) == 1
    assert q.lease(count=1).jobs[0].job.id == info.id


def test_stats_counts_every_state_and_the_oldest_wait(q: QueueDriver) -> None:
    empty = transitions.parse_stats(q.keys, q.run(transitions.stats_call(q.keys)))
    assert (empty.pending, empty.scheduled, empty.active, empty.dead, empty.latency_s) == (0, 0, 0, 0, 0.0)
    first = q.enqueue().id
    q.enqueue()
    q.enqueue(delay=60)
    dead = q.enqueue().id
    leased = {j.job.id: j for j in q.lease(count=1).jobs}
    q.enqueue()
    stats = transitions.parse_stats(q.keys, q.run(transitions.stats_call(q.keys)))
    assert first in leased
    assert (stats.pending, stats.scheduled, stats.active, stats.dead, stats.paused) == (3, 1, 1, 0, False)
    oldest = q.job(q.redis.lindex(q.keys.pending, -1).decode())  # type: ignore[union-attr]
    assert oldest is not None
    assert stats.oldest_ready_ms == oldest.created_ms
    assert dead


def test_batch_counters_follow_the_jobs(q: QueueDriver) -> None:
    ids = [q.enqueue(batch="spark-1", max_attempts=1).id for _ in range(3)]
    leased = {j.job.id: j for j in q.lease().jobs}
    q.ack(ids[0], leased[ids[0]].token)
    q.kill(ids[1], leased[ids[1]].token)
    assert q.redis.hgetall(q.keys.batch("spark-1")) == {b"total": b"3", b"done": b"1", b"dead": b"1"}
    q.run(transitions.requeue_call(q.keys, [ids[1]]))
    assert q.redis.hget(q.keys.batch("spark-1"), "dead") == b"0"
    assert q.redis.pttl(q.keys.batch("spark-1")) > 0


def test_scripts_reload_after_the_server_forgets_them(q: QueueDriver) -> None:
    q.redis.script_flush()
    assert q.enqueue().created
    assert len(q.lease().jobs) == 1


def test_a_malformed_enqueue_call_writes_nothing(q: QueueDriver) -> None:
    """A producer in another language calling the script wrongly gets an error and no half-write."""
    good = [q.keys.prefix, "ok-1", "t", b"{}", 0, 0, "", 0, 0]
    sneaky = ["bad-1", "t", b"{}", 0, 0, "", 0, 1, "attempt", "99"]
    call = ScriptCall(script("enqueue"), (q.keys.pending, q.keys.scheduled, q.keys.wake), (*good, *sneaky))
    with pytest.raises(redis.ResponseError, match='unknown job field "attempt"'):
        transport.execute(q.redis, [call])
    truncated = ScriptCall(call.script, call.keys, (*good, "bad-2", "t"))
    with pytest.raises(redis.ResponseError, match="malformed record"):
        transport.execute(q.redis, [truncated])
    bad_values = [
        (["bad-3", "t", b"{}", "soon", 0, "", 0, 0], "must be numbers"),
        (["bad-4", "t", b"{}", 0, 0, "lock", 0, 0], "positive unique_ttl_ms"),
        (["bad-5", "t", b"{}", 0, 0, "", 0, 1, "max_attempts", "five"], "max_attempts must be a positive number"),
        (["bad-6", "t", b"{}", 0, 0, "", 0, 1, "meta", "{not json"], "meta must be a JSON object"),
    ]
    for record, message in bad_values:
        bad = ScriptCall(call.script, call.keys, (*good, *record))
        with pytest.raises(redis.ResponseError, match=message):
            transport.execute(q.redis, [bad])
    assert q.snapshot() == {}


def test_requeue_moves_an_id_named_twice_only_once(q: QueueDriver) -> None:
    info = q.enqueue()
    q.kill(info.id, q.lease_one().token)
    assert q.run(transitions.requeue_call(q.keys, [info.id, info.id])) == 1
    assert q.where(info.id) is State.PENDING
    assert q.run(transitions.purge_call(q.keys, [info.id, info.id])) == 0


def test_reap_reports_when_the_earliest_lease_left_expires(q: QueueDriver) -> None:
    """The reaper sleeps until then (docs/protocol.md, reap)."""
    assert transitions.parse_reap(q.run(transitions.reap_call(q.keys))).next_expiry_in is None
    q.enqueue()
    q.lease_one(lease_ms=60_000)
    q.enqueue()
    q.lease_one(lease_ms=30_000)
    reaped = transitions.parse_reap(q.run(transitions.reap_call(q.keys)))
    assert reaped.moved == {}
    assert reaped.next_expiry_in is not None
    assert 29 < reaped.next_expiry_in <= 30
    over_limit = [q.enqueue().id for _ in range(3)]
    q.lease(count=3, lease_ms=1)

    def expired() -> int:
        seconds, microseconds = q.redis.time()
        return int(q.redis.zcount(q.keys.active, "-inf", f"({seconds * 1000 + microseconds // 1000}"))

    wait_for(lambda: expired() == 3, what="3 leases to expire")
    first = transitions.parse_reap(q.run(transitions.reap_call(q.keys, limit=2)))
    assert len(first.moved) == 2
    assert first.next_expiry_in == 0, "one more is due now: the next pass comes at once"
    assert set(q.reap()) | set(first.moved) == set(over_limit)


def test_a_lock_or_batch_key_of_another_type_never_leaves_a_merged_ack_half_done(q: QueueDriver) -> None:
    """docs/protocol.md, keys of the wrong type: the second job's unique lock holds a hash and the third's
    batch counters a string; the ack of all three finishes all three and leaves those keys for fsck."""
    first = q.enqueue("t", 1, unique_for=60, unique_key="a").id
    second = q.enqueue("t", 2, unique_for=60, unique_key="b").id
    third = q.enqueue("t", 3, batch="b3").id
    tokens = {j.job.id: j.token for j in q.lease(count=3).jobs}
    q.redis.delete(q.keys.unique("b"), q.keys.batch("b3"))
    q.redis.hset(q.keys.unique("b"), "not", "a lock")
    q.redis.set(q.keys.batch("b3"), "not counters")
    merged = transitions.merge_acks([transitions.ack_call(q.keys, i, tokens[i]) for i in (first, second, third)])
    assert transitions.parse_ack(q.run(merged)) == [1, 1, 1]
    assert q.redis.zcard(q.keys.active) == 0
    assert all(q.job(i) is None for i in (first, second, third))
    assert not q.redis.exists(q.keys.unique("a")), "a lock of the right type is released as ever"
    assert q.redis.hgetall(q.keys.unique("b")) == {b"not": b"a lock"}
    assert q.redis.get(q.keys.batch("b3")) == b"not counters"


def test_an_enqueue_meeting_a_job_key_of_another_type_writes_nothing(q: QueueDriver) -> None:
    """docs/protocol.md, keys of the wrong type: a batch is refused before its first write; so is a lone job
    (its own first read fails first)."""
    q.redis.set(q.keys.job("taken"), "not a job")
    before = q.snapshot()
    with pytest.raises(redis.ResponseError, match=r"jobcar: .*job:taken holds a string, not a hash"):
        q.producer.enqueue_many([("t", 1, {"job_id": "fine"}), ("t", 2, {"job_id": "taken"})])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        q.enqueue("t", 3, job_id="taken")
    assert q.snapshot() == before
    assert q.job("fine") is None
    assert q.redis.llen(q.keys.pending) == 0


def test_requeue_moves_the_good_dead_jobs_and_drops_an_id_whose_key_is_not_a_hash(q: QueueDriver) -> None:
    """docs/protocol.md, keys of the wrong type: the operators' bulk requeue never stops half-way."""
    dead = []
    for n in range(3):
        q.enqueue("t", n)
        leased = q.lease_one()
        q.kill(leased.job.id, leased.token)
        dead.append(leased.job.id)
    q.redis.delete(q.keys.job(dead[1]))
    q.redis.set(q.keys.job(dead[1]), "not a job")
    assert q.run(transitions.requeue_call(q.keys, dead)) == 2
    assert q.where(dead[0]) is State.PENDING
    assert q.where(dead[2]) is State.PENDING
    assert q.redis.zcard(q.keys.dead) == 0
    assert q.redis.get(q.keys.job(dead[1])) == b"not a job", "left for fsck"


def test_requeue_into_a_pending_key_of_another_type_is_refused_whole(q: QueueDriver) -> None:
    q.enqueue("t", 1)
    leased = q.lease_one()
    q.kill(leased.job.id, leased.token)
    q.redis.set(q.keys.pending, "not a list")
    before = q.redis.zrange(q.keys.dead, 0, -1)
    with pytest.raises(redis.ResponseError, match="holds a string, not a list"):
        q.run(transitions.requeue_call(q.keys, [leased.job.id]))
    assert q.redis.zrange(q.keys.dead, 0, -1) == before
    assert q.redis.hget(q.keys.job(leased.job.id), "state") == b"dead"


def test_a_job_named_twice_in_one_merged_ack_ends_once(q: QueueDriver) -> None:
    """Its second copy is a lost lease: the batch counts it once, and it gives back one slot, not two."""
    info = q.enqueue("t", batch="b1")
    leased = q.lease_one()
    ack = transitions.ack_call(q.keys, info.id, leased.token)
    assert q.run(transitions.merge_acks([ack, ack])) == [1, 0]
    assert q.redis.hget(q.keys.batch("b1"), "done") == b"1"
