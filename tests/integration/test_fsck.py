"""`jobcar fsck`: each corruption of docs/protocol.md's invariants, made on purpose with plain Redis
commands, is reported without changing anything, then repaired with --repair (a second run finds
nothing). A healthy queue, built with the store's real scripts, has no findings."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pytest

from jobcar import handler_calls
from jobcar.cli import main
from jobcar.dependency_calls import depend_call
from jobcar.fsck.checks import CHECKS, PENDING_COUNTS, Check
from jobcar.fsck.findings import Kind, Suspect
from jobcar.fsck.recount import recount_call
from jobcar.fsck.repairs import Target, confirm_count, recount
from jobcar.job import EnqueueStatus, State
from jobcar.keys import QueueKeys, daemons_key
from jobcar.replies import as_text
from tests.integration.driver import QueueDriver
from tests.integration.layouts import run_async
from tests.integration.test_cli import cli

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(config: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    def run(*args: str) -> tuple[int, str, str]:
        code = main(["-c", str(config), "fsck", *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def findings(run: Run, *args: str) -> tuple[int, list[dict[str, object]]]:
    code, out, err = run("--json", *args)
    assert err == "", err
    found = json.loads(out)
    assert isinstance(found, list)
    return code, found


def enqueue_id(q: QueueDriver, job_id: str, **options: object) -> str:
    return q.enqueue("t", {"id": job_id}, job_id=job_id, **options).id


class Miscount(Enum):
    """What a corruption does to the queue's pending counts besides its own finding."""

    NONE = "none"
    #: A counted job taken out of its list or its state by hand: the counts are reported wrong with it, and the
    #: case's own repair puts the job back where they count it (the recount after it changes nothing).
    UNTIL_REPAIRED = "until repaired"
    #: A counted job gone for good: the counts stay wrong after the case's own repair, which the recount fixes.
    RECOUNTED = "recounted"


@dataclass
class Case:
    """Corrupts the queue, returning (kind, id) of the finding it makes; `check` looks at the repair."""

    corrupt: Callable[[QueueDriver], tuple[str, str]]
    check: Callable[[QueueDriver], None]
    miscount: Miscount = Miscount.NONE


def _missing_hash(q: QueueDriver) -> tuple[str, str]:
    q.redis.lpush(q.keys.pending, "ghost")
    return "missing_hash", "ghost"


def _missing_hash_check(q: QueueDriver) -> None:
    assert q.sets_of("ghost") == []


def _missing_hash_zset(q: QueueDriver) -> tuple[str, str]:
    q.redis.zadd(q.keys.scheduled, {"ghost": 1})
    return "missing_hash", "ghost"


def _orphan_pending(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "p")
    q.redis.lrem(q.keys.pending, 0, "p")
    return "orphan_hash", "p"


def _orphan_scheduled(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "s", delay=3600)
    q.redis.zrem(q.keys.scheduled, "s")
    return "orphan_hash", "s"


def _orphan_scheduled_check(q: QueueDriver) -> None:
    assert q.where("s") is State.SCHEDULED
    assert q.redis.zscore(q.keys.scheduled, "s") == float(q.redis.hget(q.keys.job("s"), "run_at") or 0)


def _orphan_dead(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "d")
    assert q.kill("d", q.lease_one().token) == 1
    q.redis.zrem(q.keys.dead, "d")
    return "orphan_hash", "d"


def _active_no_deadline(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "a")
    q.lease_one()
    q.redis.zrem(q.keys.active, "a")
    return "active_without_lease", "a"


def _active_no_token(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "a")
    q.lease_one()
    q.redis.hdel(q.keys.job("a"), "token")
    return "active_without_lease", "a"


def _back_to_pending(q: QueueDriver) -> None:
    assert q.where("a") is State.PENDING
    job = q.job("a")
    assert job is not None
    assert job.attempt == 1
    assert job.token is None


def _done_without_ttl(q: QueueDriver) -> tuple[str, str]:
    q.redis.hset(q.keys.job("f"), mapping={"type": "t", "payload": "1", "state": "done", "created": "1"})
    return "no_ttl", "f"


def _done_check(q: QueueDriver) -> None:
    assert 0 < q.redis.pttl(q.keys.job("f")) <= 86400 * 1000


def _state_mismatch(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "m")
    q.redis.hset(q.keys.job("m"), "state", "scheduled")
    return "state_mismatch", "m"


def _duplicate_pending(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "x")
    enqueue_id(q, "y")
    q.redis.lpush(q.keys.pending, "x", "x")
    return "duplicate_pending", "x"


def _duplicate_check(q: QueueDriver) -> None:
    assert q.where("x") is State.PENDING
    assert q.redis.lrange(q.keys.pending, 0, -1).count(b"x") == 1


def _orphan_priority(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "p", priority=6)
    q.redis.delete(q.keys.pending_lists[6])
    return "orphan_hash", "p"


def _orphan_priority_check(q: QueueDriver) -> None:
    assert q.where("p") is State.PENDING
    assert q.redis.lrange(q.keys.pending_lists[6], 0, -1) == [b"p"], "back in its own priority's list"


#: A limit of one running job of type t (ADR 0014), as the daemon passes it to the lease.
ONE_AT_A_TIME = '{"t": {"total": 1}}'


def _lease_one_hold_one(q: QueueDriver, running: str) -> None:
    """Job `running` leased under ONE_AT_A_TIME, and job "h" held behind it."""
    enqueue_id(q, running)
    enqueue_id(q, "h")
    assert [leased.job.id for leased in q.lease(limits=ONE_AT_A_TIME).jobs] == [running]


def _orphan_held(q: QueueDriver) -> tuple[str, str]:
    _lease_one_hold_one(q, "running")
    q.redis.delete(q.keys.held("t"))  # the held list lost
    return "orphan_hash", "h"


def _held_back_to_pending(q: QueueDriver) -> None:
    assert q.where("h") is State.PENDING
    assert q.lease(limits=ONE_AT_A_TIME).jobs == [], "held again: its group is still full"
    assert q.redis.lrange(q.keys.held("t"), 0, -1) == [b"h"]


def _leaked_slot(q: QueueDriver) -> tuple[str, str]:
    _lease_one_hold_one(q, "gone")
    q.redis.delete(q.keys.job("gone"))
    q.redis.zrem(q.keys.active, "gone")
    return "leaked_slot", "gone"


def _string_at(key_of: Callable[[QueueKeys], str]) -> Callable[[QueueDriver], tuple[str, str]]:
    """A corruption: a string, written by something else than jobcar, where `key_of` names a key."""

    def corrupt(q: QueueDriver) -> tuple[str, str]:
        q.redis.set(key_of(q.keys), "written by something else")
        return "wrong_type", key_of(q.keys)

    return corrupt


def _gone(key_of: Callable[[QueueKeys], str]) -> Callable[[QueueDriver], None]:
    """The check after a repair that deleted the key `key_of` names."""

    def check(q: QueueDriver) -> None:
        assert not q.redis.exists(key_of(q.keys))

    return check


def _job_key_wrong_type(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "j")
    q.redis.set(q.keys.job("j"), "written by something else")  # its id stays in pending
    return "wrong_type", q.keys.job("j")


def _job_key_gone(q: QueueDriver) -> None:
    assert not q.redis.exists(q.keys.job("j"))
    assert q.sets_of("j") == [], "out of every set, so that no script meets it again"


def _unique_lock_wrong_type(q: QueueDriver) -> tuple[str, str]:
    q.redis.hset(q.keys.unique("k"), "written by", "something else")
    return "wrong_type", q.keys.unique("k")


def _schedule_wrong_type(q: QueueDriver) -> tuple[str, str]:
    q.redis.set(q.keys.schedule("s"), "written by something else")
    return "wrong_type", q.keys.schedule("s")


def _held_list_wrong_type(q: QueueDriver) -> tuple[str, str]:
    q.redis.sadd(q.keys.limit_groups, "t")
    q.redis.set(q.keys.held("t"), "not a list")
    return "wrong_type", q.keys.held("t")


def _slot_hash_wrong_type(q: QueueDriver) -> tuple[str, str]:
    _lease_one_hold_one(q, "a")
    q.redis.delete(q.keys.slots("t"))
    q.redis.sadd(q.keys.slots("t"), "a")  # written by something else than jobcar
    return "wrong_type", q.keys.slots("t")


def _active_no_token_slot(q: QueueDriver) -> tuple[str, str]:
    _lease_one_hold_one(q, "a")
    q.redis.hdel(q.keys.job("a"), "token")
    return "active_without_lease", "a"


def _unleased_and_slot_back(q: QueueDriver) -> None:
    _back_to_pending(q)
    assert not q.redis.exists(q.keys.slots("t"))
    assert q.redis.lrange(q.keys.released, 0, -1) == [b"h"], "the held job was let go to take the slot"


def _slot_given_back(q: QueueDriver) -> None:
    assert not q.redis.exists(q.keys.slots("t"))
    assert q.where("h") is State.PENDING, "the held job takes the slot"


def _duplicate_across_priorities(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "x", priority=2)
    q.redis.lpush(q.keys.pending_lists[8], "x")
    return "duplicate_pending", "x"


def _duplicate_across_check(q: QueueDriver) -> None:
    assert q.sets_of("x") == [State.PENDING]
    assert q.redis.lrange(q.keys.pending_lists[2], 0, -1) == [b"x"], "the entry leased first is kept"


def _window_no_ttl(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "w", unique_for=60, unique_key="k", unique_mode="window")
    q.redis.persist(q.keys.window("k"))
    return "unique_no_ttl", q.keys.window("k")


def _window_ttl_check(q: QueueDriver) -> None:
    assert 0 < q.redis.pttl(q.keys.window("k")) <= 86400 * 1000


def _debounce_wrong_type(q: QueueDriver) -> tuple[str, str]:
    q.redis.hset(q.keys.debounce("k"), "a", "b")
    return "wrong_type", q.keys.debounce("k")


def _debounce_gone(q: QueueDriver) -> None:
    assert q.redis.exists(q.keys.debounce("k")) == 0


def _schedule_missing(q: QueueDriver) -> tuple[str, str]:
    q.redis.zadd(q.keys.schedules, {"ghost": 1000})
    return "schedule_missing", "ghost"


def _schedule_missing_check(q: QueueDriver) -> None:
    assert q.redis.zscore(q.keys.schedules, "ghost") is None


def _schedule_unindexed(q: QueueDriver) -> tuple[str, str]:
    q.producer.upsert_schedule("hourly", type="t", every="1h")
    q.redis.zrem(q.keys.schedules, "hourly")
    return "schedule_unindexed", "hourly"


def _schedule_indexed_again(q: QueueDriver) -> None:
    state = q.producer.schedule("hourly")
    assert state is not None
    assert q.redis.zscore(q.keys.schedules, "hourly") == state.next_ms


def _unique_missing(q: QueueDriver) -> tuple[str, str]:
    q.redis.set(q.keys.unique("k"), "ghost", px=3_600_000)
    return "stale_unique", q.keys.unique("k")


def _unique_finished(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "d")
    assert q.kill("d", q.lease_one().token) == 1
    q.redis.set(q.keys.unique("k"), "d", px=3_600_000)
    return "stale_unique", q.keys.unique("k")


def _unique_gone(q: QueueDriver) -> None:
    assert q.redis.exists(q.keys.unique("k")) == 0


def _unique_no_ttl(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "u", unique_for=60, unique_key="k")
    q.redis.persist(q.keys.unique("k"))
    return "unique_no_ttl", q.keys.unique("k")


def _unique_ttl_check(q: QueueDriver) -> None:
    assert q.redis.get(q.keys.unique("k")) == b"u"
    assert 0 < q.redis.pttl(q.keys.unique("k")) <= 86400 * 1000


def _dead_too_old(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "old")
    enqueue_id(q, "new")
    for leased in q.lease(2).jobs:
        assert q.kill(leased.job.id, leased.token) == 1
    q.redis.zadd(q.keys.dead, {"old": 1000})  # died in 1970: far beyond max_age
    return "dead_over_limit", "dead"


def _dead_trimmed(q: QueueDriver) -> None:
    assert q.job("old") is None
    assert q.sets_of("old") == []
    assert q.where("new") is State.DEAD


def _settled(state: State, job_id: str) -> Callable[[QueueDriver], None]:
    def check(q: QueueDriver) -> None:
        assert q.where(job_id) is state

    return check


def _waits_then_runs_after(dependency: str, job_id: str) -> Callable[[QueueDriver], None]:
    """The repair never runs a job before what it waits for: it still waits, and runs once that is done."""

    def check(q: QueueDriver) -> None:
        assert q.where(job_id) is State.WAITING
        assert q.redis.smembers(q.keys.deps(job_id)) == {f"{q.keys.queue}/{dependency}".encode()}
        leased = q.lease_one()
        assert leased.job.id == dependency
        q.ack(dependency, leased.token)
        assert q.where(job_id) is State.PENDING

    return check


def _aged(q: QueueDriver, job_id: str) -> None:
    """A waiting job enqueued long ago: fsck leaves younger ones to their producer."""
    q.redis.zadd(q.keys.waiting, {job_id: 1})


def _unregistered_dependency(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "first")
    enqueue_id(q, "next", after=["first"])
    q.redis.delete(q.keys.dependents("first"))  # as if the producer died before registering "next"
    q.redis.hdel(q.keys.job("first"), "dependents")
    _aged(q, "next")
    return "lost_dependency", "next"


def _registered_again(q: QueueDriver) -> None:
    assert q.redis.smembers(q.keys.dependents("first")) == {b"default/next"}
    assert q.where("next") is State.WAITING


def _vanished_dependency(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "first")
    enqueue_id(q, "next", after=["first"])
    # Deleted by hand, never ended: its dependents SET, left behind, names "next" still.
    q.redis.delete(q.keys.job("first"))
    q.redis.lrem(q.keys.pending, 0, "first")
    _aged(q, "next")
    return "lost_dependency", "next"


def _waiting_for_nothing(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "first")
    enqueue_id(q, "next", after=["first"])
    q.redis.delete(q.keys.deps("next"))
    _aged(q, "next")
    return "waiting_for_nothing", "next"


def _deps_wrong_type(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "first", delay=600)  # not due for ten minutes: "next" must not run before it
    enqueue_id(q, "ended")
    assert q.ack("ended", q.lease_one().token, retention_ms=60_000) == 1
    enqueue_id(q, "next", after=["first", "ended"])
    q.redis.delete(q.keys.deps("next"))
    q.redis.set(q.keys.deps("next"), "written by something else")
    _aged(q, "next")
    return "wrong_type", q.keys.deps("next")


def _waits_again(q: QueueDriver) -> None:
    assert q.where("next") is State.WAITING, "never run before its dependency"
    assert q.redis.smembers(q.keys.deps("next")) == {b"default/first"}, "the ended one told it at once"
    assert q.redis.smembers(q.keys.dependents("first")) == {b"default/next"}


def _deps_wrong_type_nothing_named(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "first", delay=600)
    enqueue_id(q, "next", after=["first"])
    q.redis.hdel(q.keys.job("next"), "after")  # nothing left to rebuild from
    q.redis.delete(q.keys.deps("next"))
    q.redis.lpush(q.keys.deps("next"), "written by something else")
    return "wrong_type", q.keys.deps("next")


def _dead_with_the_reason(q: QueueDriver) -> None:
    job = q.job("next")
    assert job is not None
    assert job.state is State.DEAD
    assert job.last_error is not None
    assert "held a list, not a set" in job.last_error


def _held_list_unindexed(q: QueueDriver) -> tuple[str, str]:
    q.redis.set(q.keys.held("t#k"), "not a list")  # its group never indexed (the lease writes it first)
    return "wrong_type", q.keys.held("t#k")


def _list_at(key_of: Callable[[QueueKeys], str]) -> Callable[[QueueDriver], tuple[str, str]]:
    """A corruption: a list, written by something else than jobcar, where `key_of` names a string."""

    def corrupt(q: QueueDriver) -> tuple[str, str]:
        q.redis.lpush(key_of(q.keys), "written by something else")
        return "wrong_type", key_of(q.keys)

    return corrupt


def _daemons(keys: QueueKeys) -> str:
    return daemons_key(keys.namespace)


def _batch_fired_untold(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "part", batch="nightly")
    q.producer.seal_batch("nightly", on_complete=("report", {"n": 1}))
    leased = q.lease_one()
    assert q.kill("part", leased.token) == 1  # the batch ends with a death: its callback is told by an entry
    q.redis.delete(q.keys.settled)  # dropped (a settle refused, say): the callback waits on
    _aged(q, "nightly.on_complete")
    return "lost_dependency", "nightly.on_complete"


def _told_with_counts(q: QueueDriver) -> None:
    job = q.job("nightly.on_complete")
    assert job is not None
    assert job.state is State.PENDING
    counts = {"queue": "default", "batch": "nightly", "total": 1, "done": 0, "dead": 1, "canceled": 0}
    assert json.loads(job.payload) == {"batch": counts, "data": {"n": 1}}


def _failed_as_gone(q: QueueDriver) -> None:
    job = q.job("next")
    assert job is not None
    assert (job.state, job.last_error) == (State.DEAD, "dependency default/first gone")


def _expired_batch(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "part", batch="nightly")
    q.producer.seal_batch("nightly", on_complete=("report", None))
    q.redis.delete(q.keys.batch("nightly"))  # its counters expired with its job still pending
    _aged(q, "nightly.on_complete")
    return "lost_dependency", "nightly.on_complete"


def _handler_data_of_a_gone_job(
    write: Callable[[QueueDriver, str], object],
) -> Callable[[QueueDriver], tuple[str, str]]:
    """A corruption: the key `write` writes for job "gone" (its log, steps or children), which has no hash."""

    def corrupt(q: QueueDriver) -> tuple[str, str]:
        write(q, "gone")
        (key,) = (as_text(k) for k in q.redis.keys(q.keys.prefix + "*:gone"))
        return "orphan_handler_data", key

    return corrupt


def _no_handler_data_left(q: QueueDriver) -> None:
    assert q.redis.keys(q.keys.prefix + "*:gone") == []


def _write_log(q: QueueDriver, job_id: str, token: str) -> None:
    entry = handler_calls.log_entry(1, "a line", q.now_ms())
    reply = handler_calls.parse_log(q.run(handler_calls.log_call(q.keys, job_id, token, [entry], 100, 10_000)))
    assert reply.refusal is None


def _write_step(q: QueueDriver, job_id: str, token: str) -> None:
    value = handler_calls.step_value(b'{"n": 1}', q.now_ms())
    assert q.run(handler_calls.step_call(q.keys, job_id, token, "first", value, 10)) == b"ok"


def _write_child(q: QueueDriver, job_id: str, token: str, child: str) -> None:
    assert q.run(handler_calls.adopt_call(q.keys, job_id, token, [f"{q.keys.queue}/{child}"], 10)) == b"ok"


def _kept_log_without_ttl(q: QueueDriver) -> tuple[str, str]:
    enqueue_id(q, "kept")
    token = q.lease_one().token
    _write_log(q, "kept", token)
    assert q.ack("kept", token, retention_ms=3_600_000) == 1
    # The job's first: both expire at the same instant (one script), and a TTL read later is no longer.
    job_ttl = q.redis.pttl(q.keys.job("kept"))
    assert 0 < q.redis.pttl(q.keys.log("kept")) <= job_ttl
    q.redis.persist(q.keys.log("kept"))
    return "handler_data_no_ttl", q.keys.log("kept")


def _expires_with_its_job(q: QueueDriver) -> None:
    job_ttl = q.redis.pttl(q.keys.job("kept"))
    assert 0 < job_ttl - 1000 < q.redis.pttl(q.keys.log("kept")) <= job_ttl
    assert q.redis.llen(q.keys.log("kept")) == 1, "kept, as the job's result is"


def _parent_waiting_for_nothing(q: QueueDriver) -> tuple[str, str]:
    """A parent that ended its attempt waiting for its child (the handler API), its deps set then lost."""
    enqueue_id(q, "first")  # what the parent once waited for (`after`), ended and gone since
    enqueue_id(q, "parent", after=["first"])
    q.ack("first", q.lease_one().token)
    assert q.job("first") is None
    leased = q.lease_one()
    assert leased.job.id == "parent"
    token = leased.token
    _write_child(q, "parent", token, "child")
    enqueue_id(q, "child")
    why, refs = handler_calls.parse_await(q.run(handler_calls.await_children_call(q.keys, "parent", token, "fail")))
    assert (why, refs) == (None, ["default/child"])
    assert as_text(q.run(depend_call(q.keys, "child", "default/parent"))) == "registered"
    q.redis.delete(q.keys.deps("parent"))
    _aged(q, "parent")
    return "waiting_for_nothing", "parent"


def _bad_setting(field: str, value: str) -> Callable[[QueueDriver], tuple[str, str]]:
    """A corruption: a field of the queue's settings, written by hand, that the enqueue script cannot use."""

    def corrupt(q: QueueDriver) -> tuple[str, str]:
        q.redis.hset(q.keys.settings, mapping={field: value, "other": "kept"})
        return "bad_setting", field

    return corrupt


def _setting_gone(field: str) -> Callable[[QueueDriver], None]:
    def check(q: QueueDriver) -> None:
        assert q.redis.hgetall(q.keys.settings) == {b"other": b"kept"}, f"only {field} deleted"
        assert q.enqueue("t").status is EnqueueStatus.CREATED

    return check


def pending_counts(q: QueueDriver) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in q.redis.hgetall(q.keys.pending_counts).items()}


def _jobs_of_two_types(q: QueueDriver) -> None:
    """Two pending email jobs, one of them of another priority, and an sms job held by a limit; the counts
    recounted, whatever the scripts counted before."""
    enqueue_id(q, "running")
    enqueue_id(q, "held")
    assert [leased.job.id for leased in q.lease(limits=ONE_AT_A_TIME).jobs] == ["running"]
    q.enqueue("email", None, job_id="e1")
    q.enqueue("email", None, job_id="e2", priority=4)
    q.run(recount_call(q.keys))
    assert pending_counts(q) == {"t": "1", "email": "2"}


def _miscounted(**fields: str | None) -> Callable[[QueueDriver], tuple[str, str]]:
    """A corruption: the fields of the pending counts written by hand (None: deleted)."""

    def corrupt(q: QueueDriver) -> tuple[str, str]:
        _jobs_of_two_types(q)
        for job_type, value in fields.items():
            if value is None:
                q.redis.hdel(q.keys.pending_counts, job_type)
            else:
                q.redis.hset(q.keys.pending_counts, job_type, value)
        return "pending_count", PENDING_COUNTS

    return corrupt


def _counted_right(q: QueueDriver) -> None:
    assert pending_counts(q) == {"t": "1", "email": "2"}


CASES = {
    "missing hash (pending)": Case(_missing_hash, _missing_hash_check),
    "missing hash (scheduled)": Case(_missing_hash_zset, _missing_hash_check),
    "orphan pending hash": Case(_orphan_pending, _settled(State.PENDING, "p"), Miscount.UNTIL_REPAIRED),
    "orphan scheduled hash": Case(_orphan_scheduled, _orphan_scheduled_check),
    "orphan dead hash": Case(_orphan_dead, _settled(State.DEAD, "d")),
    "active without deadline": Case(_active_no_deadline, _back_to_pending),
    "active without token": Case(_active_no_token, _back_to_pending),
    "done without ttl": Case(_done_without_ttl, _done_check),
    "state mismatch": Case(_state_mismatch, _settled(State.PENDING, "m"), Miscount.UNTIL_REPAIRED),
    "duplicate pending": Case(_duplicate_pending, _duplicate_check),
    "orphan pending hash of a priority": Case(_orphan_priority, _orphan_priority_check, Miscount.UNTIL_REPAIRED),
    "duplicate across priorities": Case(_duplicate_across_priorities, _duplicate_across_check),
    "held hash out of its list": Case(_orphan_held, _held_back_to_pending, Miscount.UNTIL_REPAIRED),
    "slot of a job that is gone": Case(_leaked_slot, _slot_given_back),
    "active without token, holding a slot": Case(_active_no_token_slot, _unleased_and_slot_back),
    "slot hash of another type": Case(_slot_hash_wrong_type, _gone(lambda k: k.slots("t"))),
    "job key of another type": Case(_job_key_wrong_type, _job_key_gone, Miscount.RECOUNTED),
    "unique lock of another type": Case(_unique_lock_wrong_type, _gone(lambda k: k.unique("k"))),
    "schedule of another type": Case(_schedule_wrong_type, _gone(lambda k: k.schedule("s"))),
    "held list of another type": Case(_held_list_wrong_type, _gone(lambda k: k.held("t"))),
    "limit groups of another type": Case(_string_at(lambda k: k.limit_groups), _gone(lambda k: k.limit_groups)),
    "throttled groups of another type": Case(_string_at(lambda k: k.throttled), _gone(lambda k: k.throttled)),
    "batch counters of another type": Case(_string_at(lambda k: k.batch("b")), _gone(lambda k: k.batch("b"))),
    "unique window without ttl": Case(_window_no_ttl, _window_ttl_check),
    "debounce key of another type": Case(_debounce_wrong_type, _debounce_gone),
    "schedule in the ZSET without a hash": Case(_schedule_missing, _schedule_missing_check),
    "schedule missing from the ZSET": Case(_schedule_unindexed, _schedule_indexed_again),
    "unique lock of a missing job": Case(_unique_missing, _unique_gone),
    "unique lock of a dead job": Case(_unique_finished, _unique_gone),
    "unique lock without ttl": Case(_unique_no_ttl, _unique_ttl_check),
    "dead set too old": Case(_dead_too_old, _dead_trimmed),
    "waiting for a job that never registered it": Case(_unregistered_dependency, _registered_again),
    "waiting for a job deleted by hand": Case(_vanished_dependency, _failed_as_gone, Miscount.RECOUNTED),
    "a batch callback whose batch expired": Case(_expired_batch, _settled(State.PENDING, "nightly.on_complete")),
    "a batch callback its batch never told": Case(_batch_fired_untold, _told_with_counts),
    "waiting for nothing": Case(_waiting_for_nothing, _waits_then_runs_after("first", "next")),
    "settled list of another type": Case(_string_at(lambda k: k.settled), _gone(lambda k: k.settled)),
    "deps set of another type": Case(_deps_wrong_type, _waits_again),
    "deps set of another type, no after": Case(_deps_wrong_type_nothing_named, _dead_with_the_reason),
    "held list of an unindexed group": Case(_held_list_unindexed, _gone(lambda k: k.held("t#k"))),
    "slot hash of an unindexed type": Case(_string_at(lambda k: k.slots("u")), _gone(lambda k: k.slots("u"))),
    "paused of another type": Case(_list_at(lambda k: k.paused), _gone(lambda k: k.paused)),
    "settings of another type": Case(_string_at(lambda k: k.settings), _gone(lambda k: k.settings)),
    "a bound that is not a whole number": Case(_bad_setting("max_pending", "lots"), _setting_gone("max_pending")),
    "a refusal count that is not a count": Case(_bad_setting("refused", "1.5"), _setting_gone("refused")),
    "a type's bound that is not a whole number": Case(
        _bad_setting("max_pending:email", "abc"), _setting_gone("max_pending:email")
    ),
    "a type's bound of 0": Case(_bad_setting("max_pending:t", "0"), _setting_gone("max_pending:t")),
    "pending counts of another type": Case(_string_at(lambda k: k.pending_counts), _gone(lambda k: k.pending_counts)),
    "a count too high": Case(_miscounted(email="5"), _counted_right),
    "a count too low": Case(_miscounted(email="1"), _counted_right),
    "a type not counted": Case(_miscounted(t=None), _counted_right),
    "a type counted that has no job": Case(_miscounted(gone="3"), _counted_right),
    "a count that is not a number": Case(_miscounted(email="two"), _counted_right),
    "dependents set of another type": Case(_string_at(lambda k: k.dependents("x")), _gone(lambda k: k.dependents("x"))),
    "waiter of another type": Case(_list_at(lambda k: k.waiter("x")), _gone(lambda k: k.waiter("x"))),
    "rate key of another type": Case(_list_at(lambda k: k.tat("@t")), _gone(lambda k: k.tat("@t"))),
    "turns of another type": Case(_string_at(lambda k: k.turns("t")), _gone(lambda k: k.turns("t"))),
    "history of another type": Case(_string_at(lambda k: k.history_hour(1)), _gone(lambda k: k.history_hour(1))),
    "daemons of another type": Case(_string_at(_daemons), _gone(_daemons)),
    "log of another type": Case(_string_at(lambda k: k.log("x")), _gone(lambda k: k.log("x"))),
    "steps of another type": Case(_string_at(lambda k: k.steps("x")), _gone(lambda k: k.steps("x"))),
    "children of another type": Case(_string_at(lambda k: k.children("x")), _gone(lambda k: k.children("x"))),
    "log of a job that is gone": Case(
        _handler_data_of_a_gone_job(lambda q, i: q.redis.rpush(q.keys.log(i), '{"line": "x"}')), _no_handler_data_left
    ),
    "steps of a job that is gone": Case(
        _handler_data_of_a_gone_job(lambda q, i: q.redis.hset(q.keys.steps(i), "first", "1 x")), _no_handler_data_left
    ),
    "children of a job that is gone": Case(
        _handler_data_of_a_gone_job(lambda q, i: q.redis.zadd(q.keys.children(i), {"default/c": 1})),
        _no_handler_data_left,
    ),
    "kept log without ttl": Case(_kept_log_without_ttl, _expires_with_its_job),
    "a parent waiting for its children, for nothing": Case(
        _parent_waiting_for_nothing, _waits_then_runs_after("child", "parent")
    ),
}


#: The tests that make each check of fsck's table find something: cases of CASES, or tests of their own.
TESTED_BY = {
    "mistyped_own_keys": [
        "limit groups of another type",
        "throttled groups of another type",
        "settled list of another type",
        "paused of another type",
        "settings of another type",
        "pending counts of another type",
    ],
    "mistyped_job_keys": ["job key of another type"],
    "mistyped_held_lists": ["held list of another type", "held list of an unindexed group"],
    "missing_hash": ["missing hash (pending)", "missing hash (scheduled)"],
    "duplicate_pending": ["duplicate pending", "duplicate across priorities"],
    "several_sets": ["test_an_id_in_two_sets_is_reported_not_guessed"],
    "state_mismatch": ["state mismatch"],
    "active_without_token": ["active without token", "active without token, holding a slot"],
    "active_without_deadline": ["active without deadline"],
    "orphan_hash": [
        "orphan pending hash",
        "orphan scheduled hash",
        "orphan dead hash",
        "orphan pending hash of a priority",
        "held hash out of its list",
    ],
    "no_ttl": ["done without ttl"],
    "bad_state": ["test_a_hash_in_no_set_and_no_known_state_is_reported_not_guessed"],
    "mistyped_unique_locks": ["unique lock of another type"],
    "stale_unique": ["unique lock of a missing job", "unique lock of a dead job"],
    "unique_no_ttl": ["unique lock without ttl"],
    "mistyped_windows": ["debounce key of another type"],
    "window_no_ttl": ["unique window without ttl"],
    "mistyped_schedules": ["schedule of another type"],
    "schedule_missing": ["schedule in the ZSET without a hash"],
    "schedule_unindexed": ["schedule missing from the ZSET"],
    "mistyped_slot_hashes": ["slot hash of another type", "slot hash of an unindexed type"],
    "leaked_slot": ["slot of a job that is gone"],
    "mistyped_batch_counters": ["batch counters of another type"],
    "mistyped_other_keys": [
        "dependents set of another type",
        "waiter of another type",
        "rate key of another type",
        "turns of another type",
        "history of another type",
        "log of another type",
        "steps of another type",
        "children of another type",
    ],
    "orphan_handler_data": [
        "log of a job that is gone",
        "steps of a job that is gone",
        "children of a job that is gone",
    ],
    "handler_data_no_ttl": ["kept log without ttl"],
    "mistyped_namespace_keys": ["daemons of another type"],
    "mistyped_deps_sets": ["deps set of another type", "deps set of another type, no after"],
    "waiting_for_nothing": ["waiting for nothing", "a parent waiting for its children, for nothing"],
    "lost_dependency": [
        "waiting for a job that never registered it",
        "waiting for a job deleted by hand",
        "a batch callback whose batch expired",
        "a batch callback its batch never told",
    ],
    "bad_settings": [
        "a bound that is not a whole number",
        "a refusal count that is not a count",
        "a type's bound that is not a whole number",
        "a type's bound of 0",
    ],
    "pending_counts": [
        "a count too high",
        "a count too low",
        "a type not counted",
        "a type counted that has no job",
        "a count that is not a number",
        "test_each_wrong_count_is_named_in_one_finding",
        "test_pending_counts_of_another_type_are_deleted_then_recounted",
    ],
    "dead_over_limit": ["dead set too old"],
}


def test_every_check_of_the_table_has_a_test() -> None:
    """A check added to the table needs a test here that makes it find something."""
    assert list(TESTED_BY) == [check.name for check in CHECKS]
    tests = set(CASES) | {name for name in globals() if name.startswith("test_")}
    assert all(names and set(names) <= tests for names in TESTED_BY.values())
    assert sorted(case for names in TESTED_BY.values() for case in names if case in CASES) == sorted(CASES)


def _check_of(case: Case) -> Check:
    (check,) = (c for c in CHECKS if any(CASES.get(name) is case for name in TESTED_BY[c.name]))
    return check


#: What `jobcar fsck` says when it finds nothing.
CLEAN = "clean: every queue checked holds to the protocol's invariants\n"


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_corruption_is_reported_then_repaired(q: QueueDriver, run: Run, case: Case) -> None:
    kind, job_id = case.corrupt(q)
    check = _check_of(case)
    assert kind == check.kind, f"{check.name} makes {check.kind} findings"
    before = q.snapshot()

    miscounted = [(Kind.PENDING_COUNT, PENDING_COUNTS)] if case.miscount is not Miscount.NONE else []
    recounted = [(Kind.PENDING_COUNT, PENDING_COUNTS)] if case.miscount is Miscount.RECOUNTED else []

    code, found = findings(run)
    assert code == 1
    assert [(f["queue"], f["kind"], f["id"], f["repaired"]) for f in found] == [
        ("default", k, i, False) for k, i in [(kind, job_id), *miscounted]
    ]
    assert q.snapshot() == before  # a check alone changes nothing

    code, found = findings(run, "--repair")
    assert code == 0, found
    assert [(f["kind"], f["id"], f["repaired"]) for f in found] == [
        (k, i, True) for k, i in [(kind, job_id), *recounted]
    ]
    case.check(q)
    assert run() == (0, CLEAN, "")


def test_an_id_in_two_sets_is_reported_not_guessed(q: QueueDriver, run: Run) -> None:
    enqueue_id(q, "two")
    q.redis.zadd(q.keys.scheduled, {"two": 1})
    before = q.snapshot()
    code, out, err = run()
    assert (code, err) == (1, "")
    assert out == "default several_sets two: in pending and scheduled (hash state pending)\n"
    assert run("--repair") == (1, out, "")  # no safe repair: still a finding
    assert q.snapshot() == before


def test_a_repair_that_uncovers_another_finding_converges_in_one_run(q: QueueDriver, run: Run) -> None:
    enqueue_id(q, "both", delay=3600)
    q.redis.zadd(q.keys.dead, {"both": 1000})  # died in 1970: the trim deletes its hash, scheduled keeps it
    code, found = findings(run, "--repair")
    assert code == 0, found
    assert [(f["kind"], f["id"], f["repaired"]) for f in found] == [
        ("dead_over_limit", "dead", True),
        ("missing_hash", "both", True),
    ]
    assert q.sets_of("both") == []
    assert run() == (0, CLEAN, "")


def test_a_hash_in_no_set_and_no_known_state_is_reported_not_guessed(q: QueueDriver, run: Run) -> None:
    q.redis.hset(q.keys.job("b"), mapping={"type": "t", "payload": "1", "state": "bogus", "created": "1"})
    before = q.snapshot()
    code, out, err = run()
    assert (code, err) == (1, "")
    assert out == "default bad_state b: hash in no set with state bogus\n"
    assert run("--repair") == (1, out, "")  # no safe repair: which set it belongs in is a guess
    assert q.snapshot() == before


def test_a_healthy_queue_in_every_state_has_no_findings(q: QueueDriver, run: Run) -> None:
    for job_id in ("done", "retried", "dead", "active"):
        enqueue_id(q, job_id)
    enqueue_id(q, "unique", unique_for=600, unique_key="k")
    done, retried, dead, active, _unique = (leased.token for leased in q.lease(5).jobs)
    # What handlers wrote through the handler API: kept with the done job, the dead one and the running one.
    _write_log(q, "done", done)
    _write_step(q, "dead", dead)
    _write_log(q, "active", active)
    _write_step(q, "active", active)
    _write_child(q, "active", active, "pending")
    # A limit group with a slot taken and a job held (ADR 0014).
    enqueue_id(q, "limited", key="k")
    enqueue_id(q, "held", key="k")
    one_per_key = '{"t": {"per_key": 1}}'
    assert [leased.job.id for leased in q.lease(2, limits=one_per_key).jobs] == ["limited"]
    # Jobs of other priorities, a unique window outliving its job, a debounced job waiting.
    enqueue_id(q, "low", priority=9)
    enqueue_id(q, "window", unique_for=600, unique_key="w", unique_mode="window")
    (window,) = (leased.token for leased in q.lease(1).jobs)
    assert q.ack("window", window) == 1
    enqueue_id(q, "debounced", debounce=600)
    q.producer.upsert_schedule("live", type="t", every="1h")
    q.producer.upsert_schedule("paused", type="t", every="1h")
    q.producer.change_schedule("paused", "pause")
    assert q.ack("done", done, retention_ms=60_000) == 1
    assert q.retry("retried", retried, delay_ms=3_600_000) == 1
    assert q.kill("dead", dead) == 1
    enqueue_id(q, "pending")
    enqueue_id(q, "later", delay=3600)
    # Jobs waiting for others, long enough for fsck to look (ADR 0016): for a job, and for a sealed batch.
    enqueue_id(q, "waits", after=["pending", "active"])
    q.producer.enqueue_many([("t", None, {"batch": "b"})])
    q.producer.seal_batch("b", on_complete=("t", None))
    for job_id in ("waits", "b.on_complete"):
        _aged(q, job_id)
        assert q.where(job_id) is State.WAITING
    assert q.where("low") is State.PENDING
    assert q.where("debounced") is State.SCHEDULED
    assert [q.where(i) for i in ("done", "retried", "dead", "active", "unique", "pending", "later")] == [
        State.DONE,
        State.SCHEDULED,
        State.DEAD,
        State.ACTIVE,
        State.ACTIVE,
        State.PENDING,
        State.SCHEDULED,
    ]
    before = q.snapshot()
    assert run() == (0, CLEAN, "")
    assert run("--repair", "--queue", "default") == (0, CLEAN, "")
    assert findings(run) == (0, [])
    assert q.snapshot() == before


def test_lines_and_exit_codes_of_a_real_process(q: QueueDriver, config: Path) -> None:
    q.redis.lpush(q.keys.pending, "ghost")
    done = cli("fsck", "-c", str(config))
    assert (done.returncode, done.stderr) == (1, ""), done
    assert done.stdout == "default missing_hash ghost: in pending without a job hash\n"
    done = cli("fsck", "--repair", "-c", str(config))
    assert (done.returncode, done.stdout) == (
        0,
        "default missing_hash ghost: in pending without a job hash [repaired]\n",
    )
    done = cli("fsck", "--json", "-c", str(config))
    assert (done.returncode, done.stdout) == (0, "[]\n"), done
    assert cli("fsck", "--queue", "bad name", "-c", str(config)).returncode == 2


def test_each_wrong_count_is_named_in_one_finding(q: QueueDriver, run: Run) -> None:
    _jobs_of_two_types(q)
    q.redis.hset(q.keys.job("untyped"), "state", "pending")  # written by hand: a job without a type
    q.redis.lpush(q.keys.pending, "untyped")
    q.redis.hset(q.keys.pending_counts, mapping={"email": "5", "gone": "3", "t": "1.0"})
    line = (
        "default pending_count pending_counts: jobs without a type: not counted, 1 pending or held; "
        "type email: counted 5, 2 pending or held; type gone: counted 3, 0 pending or held; "
        "type t: counted '1.0', 1 pending or held"
    )
    assert run() == (1, line + "\n", "")
    assert run("--repair") == (0, line + " [repaired]\n", "")
    assert pending_counts(q) == {"": "1", "t": "1", "email": "2"}
    assert run() == (0, CLEAN, "")


def test_true_counts_are_not_reported(q: QueueDriver, run: Run) -> None:
    _jobs_of_two_types(q)
    before = q.snapshot()
    assert run("--repair") == (0, CLEAN, "")
    assert q.snapshot() == before


def test_pending_counts_of_another_type_are_deleted_then_recounted(q: QueueDriver, run: Run) -> None:
    _jobs_of_two_types(q)
    q.redis.delete(q.keys.pending_counts)
    q.redis.lpush(q.keys.pending_counts, "written by something else")
    code, found = findings(run)
    assert code == 1
    assert [(f["kind"], f["id"]) for f in found] == [("wrong_type", q.keys.pending_counts)], "no count read from it"

    code, found = findings(run, "--repair")
    assert code == 0, found
    assert [(f["kind"], f["id"], f["repaired"]) for f in found] == [
        ("wrong_type", q.keys.pending_counts, True),
        ("pending_count", PENDING_COUNTS, True),
    ]
    _counted_right(q)
    assert run() == (0, CLEAN, "")


def test_a_count_right_by_the_time_of_its_repair_is_dropped(q: QueueDriver) -> None:
    """The recount is the repair's atomic re-check: a count that a picture read while daemons ran made look wrong
    is left alone, and the finding dropped."""
    _jobs_of_two_types(q)
    suspect = Suspect(PENDING_COUNTS, "type email: counted 1, 2 pending or held")

    def repair() -> Suspect | None:
        return run_async(q.redis, lambda client: recount(Target(client, q.keys, q.dead_limits), suspect))

    before = q.snapshot()
    assert repair() is None
    assert q.snapshot() == before
    q.redis.hset(q.keys.pending_counts, "email", "1")
    assert repair() == suspect
    _counted_right(q)


def test_a_reported_count_is_confirmed_at_one_instant_first(q: QueueDriver) -> None:
    """Without --repair, a count the picture shows wrong is reported only if a recount that writes nothing finds
    it wrong too: a busy queue's lists, hashes and counts, read apart, would almost always disagree."""
    _jobs_of_two_types(q)
    suspect = Suspect(PENDING_COUNTS, "type email: counted 1, 2 pending or held")

    def confirm() -> Suspect | None:
        return run_async(q.redis, lambda client: confirm_count(Target(client, q.keys, q.dead_limits), suspect))

    assert confirm() is None, "a passing view"
    q.redis.hset(q.keys.pending_counts, "email", "1")
    before = q.snapshot()
    assert confirm() == suspect
    assert q.snapshot() == before, "a confirmation writes nothing"
