"""What the handler API writes into Redis (docs/protocol.md, the handler's writes), against the real server:
each write is fenced by the attempt's lease, bounded, and the job's handler data (its log, steps and
children) goes when the job goes and expires with a kept job, on every path that ends or deletes a job.

The writes are handler_calls' own script calls, run on jobs leased with the test driver."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from jobcar import handler_calls, transport
from jobcar.dependency_calls import depend_call, settle_call
from jobcar.enqueueing import EnqueueRecord, enqueue_calls
from jobcar.job import State
from jobcar.keys import job_ref
from jobcar.replies import as_text
from jobcar.scripts import Reply, ScriptCall
from jobcar.transitions import CancelResult, DeadLetterLimits, cancel_call, parse_cancel, purge_call
from tests.integration.driver import QueueDriver

#: Bounds large enough not to matter where a test does not look at them.
LINES, BYTES, STEPS, CHILDREN = 100, 100_000, 10, 10


def leased(q: QueueDriver, job_id: str, lease_ms: int = 30_000) -> str:
    """Enqueue `job_id` and lease it (the only pending job): its lease token."""
    q.enqueue("t", {"id": job_id}, job_id=job_id)
    leased_job = q.lease_one(lease_ms=lease_ms)
    assert leased_job.job.id == job_id
    return leased_job.token


def refusal(reply: Reply) -> str:
    """The status of a handler write's reply: "ok", or why it was refused (log and await_children reply a list
    whose first item says it)."""
    return as_text(reply[0] if isinstance(reply, list) else reply)


def side_keys(q: QueueDriver, job_id: str) -> list[str]:
    return [q.keys.log(job_id), q.keys.steps(job_id), q.keys.children(job_id)]


def write_all(q: QueueDriver, job_id: str, token: str, child: str = "c") -> None:
    """Progress, a log line, a step and a child, through the scripts, as the handler API writes them."""
    document = handler_calls.progress_document(1, 50.0, "half way")
    assert refusal(q.run(handler_calls.progress_call(q.keys, job_id, token, document))) == "ok"
    entry = handler_calls.log_entry(1, "a line", handler_calls.now_ms())
    assert refusal(q.run(handler_calls.log_call(q.keys, job_id, token, [entry], LINES, BYTES))) == "ok"
    value = handler_calls.step_value(b'{"n":1}', handler_calls.now_ms())
    assert refusal(q.run(handler_calls.step_call(q.keys, job_id, token, "first", value, STEPS))) == "ok"
    ref = job_ref(q.keys.queue, child)
    assert refusal(q.run(handler_calls.adopt_call(q.keys, job_id, token, [ref], CHILDREN))) == "ok"
    assert q.redis.hget(q.keys.job(job_id), "handler_data") == b"1"
    assert q.redis.exists(*side_keys(q, job_id)) == 3


def remaining(q: QueueDriver, job_id: str) -> int:
    """How many of the job's handler data keys exist."""
    return int(q.redis.exists(*side_keys(q, job_id)))


def store_child(q: QueueDriver, child: str, parent: str) -> None:
    """A child job as the handler API stores it: a record naming its parent."""
    record = EnqueueRecord(
        id=child, queue=q.keys.queue, type="t", payload=b"null", parent=job_ref(q.keys.queue, parent)
    )
    transport.execute(q.redis, enqueue_calls(q.namespace, [record]))


# -- the cleanup rules ------------------------------------------------------------------------------


def test_ack_without_retention_deletes_the_handler_data(q: QueueDriver) -> None:
    token = leased(q, "j")
    write_all(q, "j", token)
    assert q.ack("j", token, retention_ms=0) == 1
    assert q.job("j") is None
    assert remaining(q, "j") == 0


def test_ack_with_retention_expires_the_handler_data_with_the_job(q: QueueDriver) -> None:
    token = leased(q, "j")
    write_all(q, "j", token)
    assert q.ack("j", token, retention_ms=60_000) == 1
    job_ttl = q.redis.pttl(q.keys.job("j"))
    assert 59_000 < job_ttl <= 60_000
    for key in side_keys(q, "j"):
        assert job_ttl - 1000 < q.redis.pttl(key) <= 60_000, key
    # Kept as long as the result, readable meanwhile.
    assert q.redis.llen(q.keys.log("j")) == 1
    assert q.redis.hkeys(q.keys.steps("j")) == [b"first"]
    assert q.redis.zrange(q.keys.children("j"), 0, -1) == [b"default/c"]


def test_ack_for_a_waiter_expires_the_handler_data_with_the_job(q: QueueDriver) -> None:
    token = leased(q, "j")
    write_all(q, "j", token)
    q.redis.set(q.keys.waiter("j"), "1", px=30_000)
    assert q.ack("j", token, retention_ms=0) == 1
    assert 0 < q.redis.pttl(q.keys.job("j")) <= 30_000
    for key in side_keys(q, "j"):
        assert 0 < q.redis.pttl(key) <= 30_000, key


def test_a_job_without_handler_data_is_acked_as_before(q: QueueDriver) -> None:
    token = leased(q, "j")
    assert q.ack("j", token, retention_ms=60_000) == 1
    assert q.redis.hget(q.keys.job("j"), "handler_data") is None
    assert remaining(q, "j") == 0


def test_a_retry_keeps_the_handler_data_and_a_cancel_of_the_pending_job_deletes_it(q: QueueDriver) -> None:
    token = leased(q, "j")
    write_all(q, "j", token)
    assert q.retry("j", token, delay_ms=0) == 1
    assert q.where("j") is State.PENDING
    assert remaining(q, "j") == 3, "kept across attempts: a retry reads its steps back"
    assert all(q.redis.pttl(key) == -1 for key in side_keys(q, "j"))
    assert parse_cancel(q.run(cancel_call(q.keys, "j"))) == (CancelResult.CANCELED, State.PENDING)
    assert q.job("j") is None
    assert remaining(q, "j") == 0


def test_a_dead_job_keeps_its_handler_data_until_purged(q: QueueDriver) -> None:
    token = leased(q, "j")
    write_all(q, "j", token)
    assert q.kill("j", token) == 1
    assert remaining(q, "j") == 3
    assert all(q.redis.pttl(key) == -1 for key in side_keys(q, "j")), "as the dead job's hash: no TTL"
    assert q.run(purge_call(q.keys, ["j"])) == 1
    assert q.job("j") is None
    assert remaining(q, "j") == 0


def test_the_dead_set_trim_deletes_the_trimmed_jobs_handler_data(q: QueueDriver) -> None:
    q.dead_limits = DeadLetterLimits(max_jobs=1)
    first = leased(q, "first")
    write_all(q, "first", first)
    assert q.kill("first", first) == 1
    second = leased(q, "second")
    write_all(q, "second", second)
    assert q.kill("second", second) == 1  # trims "first", the oldest
    assert q.job("first") is None
    assert remaining(q, "first") == 0
    assert q.where("second") is State.DEAD
    assert remaining(q, "second") == 3


def _waiting_for_children(q: QueueDriver, parent: str, children: list[str]) -> str:
    """`parent` leased, its handler data written, `children` adopted and stored (the parent is about to end
    its attempt waiting for them): the token of its attempt."""
    token = leased(q, parent)
    write_all(q, parent, token, child=children[0])
    refs = [job_ref(q.keys.queue, child) for child in children]
    assert refusal(q.run(handler_calls.adopt_call(q.keys, parent, token, refs, CHILDREN))) == "ok"
    for child in children:
        store_child(q, child, parent)
    return token


def test_settles_cancel_path_deletes_the_waiting_jobs_handler_data(q: QueueDriver) -> None:
    token = _waiting_for_children(q, "p", ["c"])
    why, refs = handler_calls.parse_await(q.run(handler_calls.await_children_call(q.keys, "p", token, "cancel")))
    assert (why, refs) == (None, ["default/c"])
    assert as_text(q.run(depend_call(q.keys, "c", "default/p"))) == "registered"
    child = q.lease_one()
    assert child.job.id == "c"
    assert q.kill("c", child.token) == 2  # its ending waits in `settled` for the settler
    assert as_text(q.run(settle_call(q.keys, "p", ["default/c"], "dead"))) == "canceled"
    assert q.job("p") is None
    assert remaining(q, "p") == 0


def test_a_parent_waits_for_its_children_then_runs_again_without_spending_an_attempt(q: QueueDriver) -> None:
    token = _waiting_for_children(q, "p", ["c1", "c2"])
    children = [q.job(child) for child in ("c1", "c2")]
    assert [None if child is None else child.parent for child in children] == ["default/p", "default/p"]
    # c1 ends before its parent waits (kept, so that it can be asked how it ended); c2 after.
    first = q.lease_one()
    assert first.job.id == "c1"
    assert q.ack("c1", first.token, retention_ms=60_000) == 1
    why, refs = handler_calls.parse_await(q.run(handler_calls.await_children_call(q.keys, "p", token, "fail")))
    assert (why, refs) == (None, ["default/c1", "default/c2"])
    parent = q.job("p")
    assert parent is not None
    assert (parent.state, parent.attempt, parent.token) == (State.WAITING, 0, None)
    assert q.where("p") is State.WAITING
    assert q.redis.hget(q.keys.job("p"), "on_dependency_failure") == b"fail"
    # The caller registers it with each child, and settles it for those that had ended.
    assert as_text(q.run(depend_call(q.keys, "c1", "default/p"))) == "done"
    assert as_text(q.run(settle_call(q.keys, "p", ["default/c1"], "done"))) == "waiting"
    assert as_text(q.run(depend_call(q.keys, "c2", "default/p"))) == "registered"
    second = q.lease_one()
    assert second.job.id == "c2"
    q.ack("c2", second.token)
    assert q.where("p") is State.PENDING
    assert not q.redis.exists(q.keys.deps("p"))
    assert remaining(q, "p") == 3, "its steps, log and children wait for its next attempt"
    again = q.lease_one()
    assert (again.job.id, again.job.attempt) == ("p", 1), "the attempt that waited was not spent"
    stored = q.redis.hget(q.keys.steps("p"), "first")
    assert isinstance(stored, bytes)
    assert handler_calls.split_step_value(stored)[1] == b'{"n":1}'
    assert q.ack("p", again.token) == 1
    assert remaining(q, "p") == 0


def test_a_parent_without_children_cannot_wait_for_them(q: QueueDriver) -> None:
    token = leased(q, "p")
    before = q.snapshot()
    why, _ = handler_calls.parse_await(q.run(handler_calls.await_children_call(q.keys, "p", token, "fail")))
    assert why == "no children"
    assert q.snapshot() == before
    assert q.where("p") is State.ACTIVE


# -- fencing ----------------------------------------------------------------------------------------

Write = Callable[[QueueDriver, str, str], ScriptCall]

WRITES: dict[str, Write] = {
    "progress": lambda q, i, token: handler_calls.progress_call(
        q.keys, i, token, handler_calls.progress_document(1, 99.0, None)
    ),
    "log": lambda q, i, token: handler_calls.log_call(
        q.keys, i, token, [handler_calls.log_entry(1, "late", handler_calls.now_ms())], LINES, BYTES
    ),
    "step": lambda q, i, token: handler_calls.step_call(q.keys, i, token, "second", b"1 x", STEPS),
    "step again": lambda q, i, token: handler_calls.step_call(q.keys, i, token, "first", b"1 x", STEPS),
    "adopt": lambda q, i, token: handler_calls.adopt_call(q.keys, i, token, ["default/late"], CHILDREN),
    "await_children": lambda q, i, token: handler_calls.await_children_call(q.keys, i, token, "run"),
}


def _reaped(q: QueueDriver) -> None:
    time.sleep(0.01)  # past its deadline of 1 ms
    assert q.reap() == {"j": "pending"}


def _reaped_and_leased_again(q: QueueDriver) -> None:
    _reaped(q)
    assert q.lease_one().job.id == "j"


def _acked(q: QueueDriver) -> None:
    q.ack("j", q.token("j"), retention_ms=60_000)


def _cancel_requested(q: QueueDriver) -> None:
    assert parse_cancel(q.run(cancel_call(q.keys, "j"))) == (CancelResult.CANCEL_REQUESTED, State.ACTIVE)


#: What moves the lease away from the attempt (or cancels it), and the refusal its writes then get.
MOVES: dict[str, tuple[Callable[[QueueDriver], None], str]] = {
    "reaped": (_reaped, "lease lost"),
    "reaped and leased again": (_reaped_and_leased_again, "lease lost"),
    "answered": (_acked, "lease lost"),
    "cancel requested": (_cancel_requested, "canceled"),
}


@pytest.mark.parametrize("move", MOVES.values(), ids=list(MOVES))
@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
def test_a_write_after_the_lease_moved_is_refused_and_writes_nothing(
    q: QueueDriver, write: Write, move: tuple[Callable[[QueueDriver], None], str]
) -> None:
    moved, why = move
    token = leased(q, "j", lease_ms=1)  # expired at once: only the reaper's pass moves it
    write_all(q, "j", token)
    moved(q)
    before = q.snapshot()
    assert refusal(q.run(write(q, "j", token))) == why
    assert q.snapshot() == before


@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
def test_a_write_for_a_job_that_is_gone_or_with_another_jobs_token_is_refused(q: QueueDriver, write: Write) -> None:
    token = leased(q, "j")
    before = q.snapshot()
    assert refusal(q.run(write(q, "other", token))) == "lease lost"
    assert refusal(q.run(write(q, "j", token + "x"))) == "lease lost"
    assert q.snapshot() == before


# -- bounds -----------------------------------------------------------------------------------------


def _log(q: QueueDriver, token: str, lines: list[str], max_lines: int, max_bytes: int) -> handler_calls.LogReply:
    entries = [handler_calls.log_entry(1, line, 1000) for line in lines]
    return handler_calls.parse_log(q.run(handler_calls.log_call(q.keys, "j", token, entries, max_lines, max_bytes)))


def _lines(q: QueueDriver) -> list[str]:
    return [json.loads(entry)["line"] for entry in q.redis.lrange(q.keys.log("j"), 0, -1)]


def _log_fields(q: QueueDriver) -> tuple[int, int]:
    kept, dropped = q.redis.hmget(q.keys.job("j"), "log_bytes", "log_dropped")
    return int(kept or 0), int(dropped or 0)


def test_the_log_keeps_its_last_lines_and_counts_those_dropped(q: QueueDriver) -> None:
    token = leased(q, "j")
    assert _log(q, token, ["1", "2", "3", "4", "5"], 3, BYTES) == handler_calls.LogReply(None, 3, 2)
    assert _lines(q) == ["3", "4", "5"]
    assert _log(q, token, ["6"], 3, BYTES) == handler_calls.LogReply(None, 3, 3)
    assert _lines(q) == ["4", "5", "6"]
    kept = sum(len(entry) for entry in q.redis.lrange(q.keys.log("j"), 0, -1))
    assert _log_fields(q) == (kept, 3)


def test_the_log_keeps_within_its_bytes_oldest_dropped_first(q: QueueDriver) -> None:
    token = leased(q, "j")
    size = len(handler_calls.log_entry(1, "a", 1000))  # every entry below is this long
    assert _log(q, token, ["a", "b", "c"], LINES, 2 * size + 1) == handler_calls.LogReply(None, 2, 1)
    assert _lines(q) == ["b", "c"]
    assert _log_fields(q) == (2 * size, 1)
    # A line over the bound alone is dropped too, and counted: nothing older survives it.
    assert _log(q, token, ["x" * 100], LINES, 2 * size + 1) == handler_calls.LogReply(None, 0, 4)
    assert _lines(q) == []
    assert _log_fields(q) == (0, 4)


def test_a_log_list_gone_while_its_job_runs_counts_from_nothing(q: QueueDriver) -> None:
    token = leased(q, "j")
    size = len(handler_calls.log_entry(1, "a", 1000))
    assert _log(q, token, ["a", "b"], LINES, 2 * size + 1) == handler_calls.LogReply(None, 2, 0)
    q.redis.delete(q.keys.log("j"))  # as fsck --repair deletes a log key that held another type
    assert _log(q, token, ["c"], LINES, 2 * size + 1) == handler_calls.LogReply(None, 1, 0)
    assert _lines(q) == ["c"]
    assert _log_fields(q) == (size, 0)


def test_a_job_keeps_at_most_its_steps_and_a_step_written_again_is_replaced(q: QueueDriver) -> None:
    token = leased(q, "j")
    assert as_text(q.run(handler_calls.step_call(q.keys, "j", token, "a", b"1 first", 2))) == "ok"
    assert as_text(q.run(handler_calls.step_call(q.keys, "j", token, "b", b"1 second", 2))) == "ok"
    before = q.snapshot()
    assert as_text(q.run(handler_calls.step_call(q.keys, "j", token, "c", b"1 third", 2))) == "too many steps"
    assert q.snapshot() == before
    assert as_text(q.run(handler_calls.step_call(q.keys, "j", token, "a", b"2 again", 2))) == "ok"
    assert q.redis.hgetall(q.keys.steps("j")) == {b"a": b"2 again", b"b": b"1 second"}


def test_a_job_adopts_at_most_its_children(q: QueueDriver) -> None:
    token = leased(q, "j")
    adopt = handler_calls.adopt_call
    assert as_text(q.run(adopt(q.keys, "j", token, ["default/c1", "default/c2"], 2))) == "ok"
    before = q.snapshot()
    assert as_text(q.run(adopt(q.keys, "j", token, ["default/c3"], 2))) == "too many children"
    assert as_text(q.run(adopt(q.keys, "j", token, ["default/c1", "default/c3"], 2))) == "too many children"
    assert q.snapshot() == before
    # A child named again (a handler's retried call) is no new child: within the bound, its time kept.
    assert as_text(q.run(adopt(q.keys, "j", token, ["default/c2"], 2))) == "ok"
    assert q.snapshot() == before
    assert q.redis.zrange(q.keys.children("j"), 0, -1) == [b"default/c1", b"default/c2"]
