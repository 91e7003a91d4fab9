"""Jobs that wait for others (`after`, chains), through the real scripts: on a standalone server and on
the Cluster, with the waiting jobs in other queues (other slots) than the jobs they wait for."""

from __future__ import annotations

import json
import re

import pytest
import redis

from jobcar import transitions
from jobcar.dependency_calls import SealResult, settle_call
from jobcar.errors import InvalidJob
from jobcar.job import EnqueueStatus, State
from jobcar.keys import job_ref
from jobcar.settler import settle_calls_of
from jobcar.transitions import DeadLetterLimits
from tests.integration.driver import QueueDriver
from tests.servers import wait_for

AnyRedis = redis.Redis | redis.RedisCluster


def carry(*queues: QueueDriver) -> int:
    """What the daemons' settler does: tell the waiting jobs of every entry in these queues' `settled`
    lists, then drop the entry. Returns how many entries there were."""
    carried = 0
    for q in queues:
        while entry := q.redis.lpop(q.keys.settled):
            carried += 1
            for call in settle_calls_of(q.keys, entry, DeadLetterLimits()):
                q.run(call)
    return carried


def run_one(q: QueueDriver, job_id: str) -> None:
    """Lease the queue's next job, which must be `job_id`, and ack it."""
    leased = q.lease_one()
    assert leased.job.id == job_id
    q.ack(job_id, leased.token)


@pytest.fixture
def queues(any_redis: AnyRedis, namespace: str) -> tuple[QueueDriver, QueueDriver]:
    # "a" and "b" hash to different Cluster slots: every step crosses nodes there.
    return QueueDriver(any_redis, namespace, "a"), QueueDriver(any_redis, namespace, "b")


def test_a_chain_runs_step_by_step_across_queues(queues: tuple[QueueDriver, QueueDriver]) -> None:
    a, b = queues
    first, second, third = a.producer.chain(
        [("s", 1, {"queue": "a"}), ("s", 2, {"queue": "b"}), ("s", 3, {"queue": "a"})]
    )
    assert [first.state, second.state, third.state] == [State.PENDING, State.WAITING, State.WAITING]
    assert b.lease().jobs == []
    assert a.lease(count=10).jobs[0].job.id == first.id
    assert len(a.lease().jobs) == 0

    a.ack(first.id, a.token(first.id))
    assert carry(a, b) == 1
    assert b.where(second.id) is State.PENDING
    released = b.job(second.id)
    assert released is not None
    assert released.run_at_ms is not None, "ready from its release: its wait for the first is not queue latency"
    assert released.run_at_ms >= released.created_ms
    assert a.where(third.id) is State.WAITING
    run_one(b, second.id)
    carry(a, b)
    run_one(a, third.id)
    assert carry(a, b) == 0, "the last step has nothing waiting for it"
    assert not any(a.redis.exists(k) for k in (a.keys.waiting, b.keys.waiting, a.keys.settled, b.keys.settled))


def test_the_ack_of_a_dependency_releases_a_job_waiting_in_its_queue_itself(q: QueueDriver) -> None:
    first, second = q.producer.chain([("s", 1), ("s", 2)])
    assert q.ack(first.id, q.lease_one().token) == 1, "nothing left for the settler"
    assert q.where(second.id) is State.PENDING, "released atomically by the ack"
    assert not q.redis.exists(q.keys.settled)


def test_one_ack_ending_several_dependencies_of_a_job_in_its_queue_tells_it_each(q: QueueDriver) -> None:
    done, also_done, canceled = (q.enqueue("part", n) for n in range(3))
    both = q.enqueue("sum", None, after=[done, also_done])
    on_all = q.enqueue("sum", None, after=[done, canceled], on_dependency_failure="run")
    leased = {j.job.id: j.token for j in q.lease(count=3).jobs}
    q.run(transitions.cancel_call(q.keys, canceled.id))
    acks = [transitions.ack_call(q.keys, done.id, leased[done.id]),
            transitions.ack_call(q.keys, also_done.id, leased[also_done.id]),
            transitions.ack_call(q.keys, canceled.id, leased[canceled.id], final=State.CANCELED)]  # fmt: skip
    q.run(transitions.merge_acks(acks))
    assert q.where(both.id) is State.PENDING, "both of its dependencies, ended in one call"
    assert q.where(on_all.id) is State.WAITING, "its canceled one is told through the settled list"
    carry(q)
    assert q.where(on_all.id) is State.PENDING


def test_a_batch_ended_by_an_ack_releases_its_callback_in_its_queue_with_the_counts(q: QueueDriver) -> None:
    q.enqueue("part", 1, batch="b")
    q.producer.seal_batch("b", on_complete=("report", {"n": [1, 2]}))
    leased = q.lease_one()
    assert q.ack(leased.job.id, leased.token) == 1, "nothing left for the settler"
    assert q.where("b.on_complete") is State.PENDING
    counts = {"queue": q.keys.queue, "batch": "b", "total": 1, "done": 1, "dead": 0, "canceled": 0}
    assert _payload(q, "b.on_complete") == {"batch": counts, "data": {"n": [1, 2]}}


def test_a_fan_in_job_runs_once_after_all_of_its_dependencies(queues: tuple[QueueDriver, QueueDriver]) -> None:
    a, b = queues
    fan_out = [("part", n, {"queue": "a" if n % 2 else "b", "job_id": f"p{n}"}) for n in range(10)]
    infos = a.producer.enqueue_many(
        [*fan_out, ("sum", None, {"queue": "a", "after": [("a" if n % 2 else "b", f"p{n}") for n in range(10)]})]
    )
    fan_in = infos[-1]
    assert fan_in.state is State.WAITING
    assert [i.id for i in infos[:10]] == [f"p{n}" for n in range(10)]
    assert a.run(transitions.stats_call(a.keys))[9] == 1, "stats count the waiting job"
    for q in (a, b):
        for leased in q.lease(count=10).jobs:
            if leased.job.type == "part":
                assert a.where(fan_in.id) is State.WAITING
                q.ack(leased.job.id, leased.token)
                carry(a, b)
    assert a.where(fan_in.id) is State.PENDING
    assert carry(a, b) == 0
    assert a.producer.get(fan_in.id, queue="a").state is State.PENDING
    assert a.run(transitions.stats_call(a.keys))[9] == 0, "no job waits any more"


def test_the_parts_of_a_fan_in_acked_in_one_call_make_one_entry(queues: tuple[QueueDriver, QueueDriver]) -> None:
    a, b = queues
    parts = a.producer.enqueue_many([("part", n, {"queue": "a"}) for n in range(3)])
    fan_in = a.producer.enqueue("sum", None, queue="b", after=parts)
    leased = a.lease(count=3).jobs
    acks = transitions.merge_acks([transitions.ack_call(a.keys, j.job.id, j.token) for j in leased])
    assert a.run(acks) == [2, 2, 2]
    (entry,) = a.redis.lrange(a.keys.settled, 0, -1)
    assert json.loads(entry) == [[i.id for i in parts], "done", [job_ref("b", fan_in.id)]]
    assert carry(a, b) == 1
    assert b.where(fan_in.id) is State.PENDING


@pytest.mark.parametrize(
    ("policy", "then"), [(None, State.DEAD), ("fail", State.DEAD), ("run", State.PENDING), ("cancel", None)]
)
def test_a_dead_dependency_ends_the_waiting_job_by_its_policy(
    queues: tuple[QueueDriver, QueueDriver], policy: str | None, then: State | None
) -> None:
    a, b = queues
    dependency = a.enqueue("dies")
    options = {"queue": "b", "after": [dependency]} | ({"on_dependency_failure": policy} if policy else {})
    waiting = a.producer.enqueue("next", None, **options)
    after_it = a.producer.enqueue("last", None, queue="a", after=[waiting])
    assert a.kill(dependency.id, a.lease_one().token, reason="broken") == 2, "an entry for the settler"
    carry(a, b)
    assert b.where(waiting.id) is then
    if then is State.DEAD:
        job = b.job(waiting.id)
        assert job is not None
        assert job.errors[-1].error == f"dependency {job_ref('a', dependency.id)} dead"
    # What waits for the waiting job follows: it ran (runs), or it died (or was canceled) and tells its own.
    carry(a, b)
    last = a.job(after_it.id)
    assert last is not None
    if then is State.PENDING:
        assert last.state is State.WAITING
    else:
        outcome = "dead" if then is State.DEAD else "canceled"
        assert last.state is State.DEAD
        assert last.errors[-1].error == f"dependency {job_ref('b', waiting.id)} {outcome}"


def test_a_chain_whose_middle_step_is_canceled_stops_there(queues: tuple[QueueDriver, QueueDriver]) -> None:
    a, b = queues
    first, middle, last = a.producer.chain([("s", n, {"queue": "a"}) for n in range(3)])
    assert a.run(transitions.cancel_call(a.keys, middle.id)) == [b"canceled", b"waiting"]
    assert a.job(middle.id) is None
    assert not a.redis.exists(a.keys.deps(middle.id))
    carry(a, b)
    assert a.where(last.id) is State.DEAD
    run_one(a, first.id)  # it still names the canceled step: telling it (in its ack) changes nothing
    assert carry(a, b) == 0
    assert a.job(middle.id) is None
    assert a.where(last.id) is State.DEAD


def test_after_a_job_enqueued_earlier_whatever_it_became(queues: tuple[QueueDriver, QueueDriver]) -> None:
    a, b = queues
    running = a.enqueue("r")
    kept = a.enqueue("k")
    gone = a.enqueue("g")
    for _job in (kept, gone, running):
        leased = a.lease_one()
        if leased.job.id == kept.id:
            a.ack(kept.id, leased.token, retention_ms=60_000)  # done, with its hash kept
        elif leased.job.id == gone.id:
            a.ack(gone.id, leased.token)  # done and deleted
    on_running = b.enqueue("w", after=[running])
    on_kept = b.enqueue("w", after=[kept])
    on_gone = b.enqueue("w", after=[gone], on_dependency_failure="fail")
    on_missing = b.enqueue("w", after=[("a", "never-enqueued")], on_dependency_failure="run")
    canceled = a.enqueue("c")
    c = a.lease_one()
    a.run(transitions.cancel_call(a.keys, canceled.id))  # canceled while it runs, and kept
    a.ack(canceled.id, c.token, retention_ms=60_000, final=State.CANCELED)
    on_canceled = b.enqueue("w", after=[canceled])
    assert b.where(on_running.id) is State.WAITING
    assert b.where(on_kept.id) is State.PENDING, "a dependency done earlier counts at once"
    gone_job = b.job(on_gone.id)
    assert gone_job is not None
    assert gone_job.state is State.DEAD
    assert gone_job.errors[-1].error == f"dependency {job_ref('a', gone.id)} gone"
    assert b.where(on_missing.id) is State.PENDING
    canceled_job = b.job(on_canceled.id)
    assert canceled_job is not None
    assert canceled_job.last_error == f"dependency {job_ref('a', canceled.id)} canceled"
    a.ack(running.id, a.token(running.id))
    carry(a, b)
    assert b.where(on_running.id) is State.PENDING


def test_an_ack_is_not_stopped_half_way_by_a_settled_list_of_another_type(
    queues: tuple[QueueDriver, QueueDriver],
) -> None:
    a, b = queues
    first = a.enqueue("a")
    waiting = b.enqueue("b", after=[first])  # in another queue: told through a's settled list
    a.redis.set(a.keys.settled, "not a list")  # fsck reports it (wrong_type) and deletes it
    token = a.lease_one().token
    before = a.snapshot()
    # Refused before its first write, naming the key: an ack that went through could not tell the waiting job.
    with pytest.raises(redis.ResponseError, match=rf"WRONGTYPE jobcar: {re.escape(a.keys.settled)} holds a string"):
        a.ack(first.id, token)
    assert a.snapshot() == before, "nothing half-written"
    a.redis.delete(a.keys.settled)  # as fsck --repair does
    assert a.ack(first.id, token) == 2
    assert a.job(first.id) is None, "the ack went through whole"
    carry(a, b)
    assert b.where(waiting.id) is State.PENDING, "and the waiting job was told"


def test_an_ack_of_jobs_without_dependents_pays_no_look_at_the_settled_list(q: QueueDriver) -> None:
    q.redis.set(q.keys.settled, "not a list")
    first = q.enqueue("a")
    assert q.ack(first.id, q.lease_one().token) == 1


def test_telling_a_waiting_job_twice_changes_nothing(q: QueueDriver) -> None:
    first = q.enqueue("a")
    waiting = q.enqueue("b", after=[first.id, q.enqueue("c").id])
    call = settle_call(q.keys, waiting.id, [job_ref(q.keys.queue, first.id)], "done")
    assert [q.run(call), q.run(call)] == [b"waiting", b"ignored"]
    assert q.where(waiting.id) is State.WAITING
    assert q.redis.scard(q.keys.deps(waiting.id)) == 1


def test_a_dependency_not_stored_by_its_call_fails_the_job_waiting_for_it(q: QueueDriver) -> None:
    holder = q.enqueue("d", unique_for=600, unique_key="k")
    waiting, duplicate = q.producer.enqueue_many(
        [("w", None, {"after": ["d1"]}), ("d", None, {"job_id": "d1", "unique_for": 600, "unique_key": "k"})]
    )
    assert (duplicate.status, duplicate.id) == (EnqueueStatus.DUPLICATE, holder.id)
    job = q.job(waiting.id)
    assert job is not None
    assert (job.state, job.last_error) == (State.DEAD, f"dependency {job_ref(q.keys.queue, 'd1')} gone")


def test_a_job_enqueued_again_with_its_id_keeps_the_jobs_waiting_for_it(q: QueueDriver) -> None:
    first = q.enqueue("a", job_id="x")
    again = q.producer.enqueue_many([("b", None, {"job_id": "y", "after": ["x"]}), ("a", None, {"job_id": "x"})])
    assert again[1].status is EnqueueStatus.EXISTS
    assert again[0].state is State.WAITING
    run_one(q, first.id)
    carry(q)
    assert q.where("y") is State.PENDING


def test_a_job_enqueued_again_after_it_ended_tells_the_jobs_of_its_call_at_once(q: QueueDriver) -> None:
    q.enqueue("a", job_id="x")
    leased = q.lease_one()
    q.ack("x", leased.token, retention_ms=60_000)  # done, and kept
    waiting, again = q.producer.enqueue_many([("b", None, {"after": ["x"]}), ("a", None, {"job_id": "x"})])
    assert (again.status, again.state) == (EnqueueStatus.EXISTS, State.DONE)
    assert q.where(waiting.id) is State.PENDING


def test_waiting_jobs_are_refused_what_they_cannot_be(q: QueueDriver) -> None:
    with pytest.raises(InvalidJob, match="cycle"):
        q.producer.enqueue_many(
            [("a", None, {"job_id": "x", "after": ["y"]}), ("b", None, {"job_id": "y", "after": ["x"]})]
        )
    with pytest.raises(InvalidJob, match="no delay"):
        q.producer.enqueue("a", None, after=["x"], delay=5)
    with pytest.raises(InvalidJob, match="needs after"):
        q.producer.enqueue("a", None, on_dependency_failure="run")
    with pytest.raises(InvalidJob, match="may not start with 'batch:'"):
        q.producer.enqueue("a", None, job_id="batch:7")
    with pytest.raises(InvalidJob, match="on_dependency_failure must be"):
        q.producer.enqueue("a", None, after=["x"], on_dependency_failure="ignore")
    assert q.snapshot() == {}, "nothing was stored"


# -- a batch's callbacks ----------------------------------------------------------------------------


def _payload(q: QueueDriver, job_id: str) -> object:
    job = q.job(job_id)
    assert job is not None
    return json.loads(job.payload)


def test_a_batch_tells_its_callbacks_once_when_its_last_jobs_end_in_one_call(
    queues: tuple[QueueDriver, QueueDriver],
) -> None:
    a, b = queues
    a.producer.enqueue_many([("part", n, {"queue": "a", "batch": "nightly"}) for n in range(4)])
    sealed = a.producer.seal_batch(
        "nightly", queue="a", on_complete=("report", {"day": 7}, {"queue": "b"}), on_success=("publish", None)
    )
    assert sealed.result is SealResult.SEALED
    complete, success = sealed.callbacks
    assert (complete.queue, complete.id, complete.state) == ("b", "nightly.on_complete", State.WAITING)
    assert (success.queue, success.id) == ("a", "nightly.on_success")
    first, second, *last_two = a.lease(count=4).jobs
    a.ack(first.job.id, first.token)
    a.kill(second.job.id, second.token, reason="bad row")
    assert carry(a, b) == 0, "two jobs of the batch still run"
    # The last two end in one script (the daemon merges acks): the batch fires once, in it.
    acks = transitions.merge_acks([transitions.ack_call(a.keys, j.job.id, j.token) for j in last_two])
    assert a.run(acks) == [1, 2], "the call that ended the batch says so for its last job: settle now"
    assert carry(a, b) == 1
    assert b.where(complete.id) is State.PENDING
    counts = {"queue": "a", "batch": "nightly", "total": 4, "done": 3, "dead": 1, "canceled": 0}
    assert _payload(b, complete.id) == {"batch": counts, "data": {"day": 7}}
    assert a.job(success.id) is None, "a job of the batch died: on_success is canceled"

    # Requeued from the dead-letter queue and done, the batch's last job fires nothing more.
    assert a.run(transitions.requeue_call(a.keys, [second.job.id])) == 1
    run_one(a, second.job.id)
    assert carry(a, b) == 0
    again = a.producer.seal_batch("nightly", queue="a", on_complete=("report", {"day": 7}, {"queue": "b"}))
    assert again.result is SealResult.FIRED
    assert b.where(complete.id) is State.PENDING, "the callback told before is left as it is"


def test_a_batch_sealed_after_its_jobs_ended_tells_its_callbacks_at_once(q: QueueDriver) -> None:
    leased = [q.enqueue("part", n, batch="b1") for n in range(2)]
    for _ in leased:
        job = q.lease_one()
        q.ack(job.job.id, job.token)
    sealed = q.producer.seal_batch("b1", on_success=("publish", [1, 2.5, 12345678901234567890]))
    assert sealed.result is SealResult.COMPLETE
    carry(q)
    counts = {"queue": q.keys.queue, "batch": "b1", "total": 2, "done": 2, "dead": 0, "canceled": 0}
    assert _payload(q, "b1.on_success") == {"batch": counts, "data": [1, 2.5, 12345678901234567890]}


def test_a_callback_takes_json_data_and_waits_for_nothing_else(q: QueueDriver) -> None:
    with pytest.raises(InvalidJob, match="must be JSON"):
        q.producer.seal_batch("b", on_complete=("report", b"raw"))
    with pytest.raises(InvalidJob, match="takes no after, delay"):
        q.producer.seal_batch("b", on_complete=("report", None, {"delay": 5, "after": ["x"]}))
    assert q.snapshot() == {}


def _expire_leases(q: QueueDriver) -> None:
    """Wait (on Redis time, which the reap reads) until the leases taken with lease_ms=1 have expired."""
    deadline = q.now_ms() + 2
    wait_for(lambda: q.now_ms() > deadline, timeout=10, what="the 1 ms leases to expire")


def _end(q: QueueDriver, job_id: str, token: str, ending: str) -> object:
    if ending == "kill":
        return q.kill(job_id, token)
    if ending == "retry":
        return q.retry(job_id, token)
    return q.reap()


@pytest.mark.parametrize(("ending", "ended"), [("kill", 2), ("retry", 3), ("reap", "dead")])
def test_a_job_others_wait_for_does_not_die_while_its_settled_list_holds_another_type(
    queues: tuple[QueueDriver, QueueDriver], ending: str, ended: object
) -> None:
    """As an ack (above): a kill, a retry that spends the last attempt and a reap that moves the job to the
    dead set are refused before their first write, naming the key, rather than end it without telling."""
    a, b = queues
    first = a.enqueue("a", max_attempts=1)
    waiting = b.enqueue("b", after=[first])
    a.redis.set(a.keys.settled, "not a list")
    token = a.lease_one(lease_ms=1 if ending == "reap" else 30_000).token
    if ending == "reap":
        _expire_leases(a)
    before = a.snapshot()
    with pytest.raises(redis.ResponseError, match=rf"WRONGTYPE jobcar: {re.escape(a.keys.settled)} holds a string"):
        _end(a, first.id, token, ending)
    assert a.snapshot() == before, "nothing half-written"
    a.redis.delete(a.keys.settled)  # as fsck --repair does
    reply = _end(a, first.id, token, ending)
    assert (reply[first.id] if isinstance(reply, dict) else reply) == ended
    carry(a, b)
    assert b.where(waiting.id) is State.DEAD, "the waiting job was told"


@pytest.mark.parametrize(("ending", "ended"), [("kill", 1), ("retry", 2), ("reap", {"x": "dead"})])
def test_a_job_without_dependents_dies_whatever_its_settled_list_holds(
    q: QueueDriver, ending: str, ended: object
) -> None:
    q.redis.set(q.keys.settled, "not a list")
    q.enqueue("a", job_id="x", max_attempts=1)
    token = q.lease_one(lease_ms=1 if ending == "reap" else 30_000).token
    if ending == "reap":
        _expire_leases(q)
    assert _end(q, "x", token, ending) == ended


def test_a_retry_that_does_not_end_the_job_pays_no_look_at_the_settled_list(
    queues: tuple[QueueDriver, QueueDriver],
) -> None:
    a, b = queues
    first = a.enqueue("a", max_attempts=1)
    b.enqueue("b", after=[first])
    a.redis.set(a.keys.settled, "not a list")
    token = a.lease_one().token
    assert a.retry(first.id, token, spend=False, max_free=5) == 1, "given back: it does not end"


def test_a_cancel_of_a_job_others_wait_for_is_refused_while_its_settled_list_holds_another_type(
    queues: tuple[QueueDriver, QueueDriver],
) -> None:
    a, b = queues
    first = a.enqueue("a")
    waiting = b.enqueue("b", after=[first])
    alone = a.enqueue("a")
    a.redis.set(a.keys.settled, "not a list")
    before = a.snapshot()
    with pytest.raises(redis.ResponseError, match=rf"WRONGTYPE jobcar: {re.escape(a.keys.settled)} holds a string"):
        a.run(transitions.cancel_call(a.keys, first.id))
    assert a.snapshot() == before, "nothing half-written"
    canceled = transitions.parse_cancel(a.run(transitions.cancel_call(a.keys, alone.id)))
    assert canceled == (transitions.CancelResult.CANCELED, State.PENDING), "a job without dependents pays nothing"
    a.redis.delete(a.keys.settled)
    canceled = transitions.parse_cancel(a.run(transitions.cancel_call(a.keys, first.id)))
    assert canceled == (transitions.CancelResult.CANCELED, State.PENDING)
    carry(a, b)
    assert b.where(waiting.id) is State.DEAD


@pytest.mark.parametrize(("policy", "ends"), [(None, State.DEAD), ("cancel", None)])
def test_a_settle_that_would_end_a_job_others_wait_for_is_refused_while_its_settled_list_holds_another_type(
    queues: tuple[QueueDriver, QueueDriver], policy: str | None, ends: State | None
) -> None:
    """x (a) <- y (b) <- z (a): x dies; telling y would end it, and y's own dependent z is told through b's
    settled list, which holds a string. The settle is refused, naming it, and y stays waiting."""
    a, b = queues
    x = a.enqueue("x")
    options = {"queue": "b", "after": [x]} | ({"on_dependency_failure": policy} if policy else {})
    y = b.producer.enqueue("y", None, **options)  # type: ignore[arg-type]
    z = a.enqueue("z", after=[y])
    b.redis.set(b.keys.settled, "not a list")
    leased = a.lease_one()
    assert a.kill(x.id, leased.token) == 2
    [entry] = a.redis.lrange(a.keys.settled, 0, -1)
    [settle] = settle_calls_of(a.keys, entry, DeadLetterLimits())
    before = b.snapshot()
    with pytest.raises(redis.ResponseError, match=rf"WRONGTYPE jobcar: {re.escape(b.keys.settled)} holds a string"):
        b.run(settle)
    assert b.snapshot() == before, "nothing half-written"
    assert b.where(y.id) is State.WAITING
    b.redis.delete(b.keys.settled)
    told = b.run(settle)
    assert (told.decode() if isinstance(told, bytes) else told) == ("dead" if ends is State.DEAD else "canceled")
    assert b.where(y.id) is ends
    a.redis.delete(a.keys.settled)
    carry(b)
    assert a.where(z.id) is State.DEAD, "y's own dependent was told"


def test_a_seal_that_would_tell_callbacks_is_refused_while_its_settled_list_holds_another_type(
    queues: tuple[QueueDriver, QueueDriver],
) -> None:
    a, b = queues
    part = a.enqueue("part", 1, batch="nightly")
    run_one(a, part.id)
    a.redis.set(a.keys.settled, "not a list")
    with pytest.raises(redis.ResponseError, match=rf"WRONGTYPE jobcar: {re.escape(a.keys.settled)} holds a string"):
        a.producer.seal_batch("nightly", queue="a", on_complete=("report", None, {"queue": "b"}))
    assert a.redis.hget(a.keys.batch("nightly"), "sealed") is None, "not sealed half-way"
    a.redis.delete(a.keys.settled)
    sealed = a.producer.seal_batch("nightly", queue="a", on_complete=("report", None, {"queue": "b"}))
    assert sealed.result is SealResult.COMPLETE
    carry(a, b)
    assert b.where("nightly.on_complete") is State.PENDING
