"""Job.from_hash: the daemon decodes every leased job with it, and readers of any hash use it too."""

from __future__ import annotations

import dataclasses

import pytest

from jobcar.job import Job, State


def test_every_stored_state_reads_back_and_a_missing_one_reads_as_pending() -> None:
    for state in State:
        assert Job.from_hash("j", "q", {b"type": b"t", b"state": state.value.encode()}).state is state
    assert Job.from_hash("j", "q", {b"type": b"t"}).state is State.PENDING
    assert Job.from_hash("j", "q", {b"type": b"t", b"state": b""}).state is State.PENDING


def test_an_unknown_state_is_a_value_error_naming_it() -> None:
    # ValueError is what the lease parser turns into "malformed job" and the CLI into a readable error.
    with pytest.raises(ValueError, match="'activ'"):
        Job.from_hash("j", "q", {b"type": b"t", b"state": b"activ"})


def test_every_field_a_job_hash_may_hold_reads_into_its_job_field() -> None:
    errors = b'[{"attempt": 1, "at": 5, "error": "boom"}]'
    progress = b'{"at": 7, "attempt": 2, "percent": 50, "message": "half"}'
    fields = {
        b"type": b"t", b"payload": b"{}", b"state": b"held", b"content_type": b"text/plain", b"attempt": b"2",
        b"max_attempts": b"5", b"timeout": b"1000", b"backoff": b"2000", b"created": b"10", b"run_at": b"20",
        b"started": b"30", b"finished": b"40", b"token": b"tok", b"errors": errors, b"unique": b"u",
        b"traceparent": b"00-tp", b"meta": b'{"m": "1"}', b"batch": b"b", b"result": b"r", b"result_dropped": b"oom",
        b"cancel": b"1", b"priority": b"3", b"expires_at": b"50", b"keep_for": b"60", b"debounce": b"d",
        b"schedule": b"s", b"scheduled_at": b"70", b"key": b"k", b"held": b"t#k", b"held_at": b"80",
        b"after": b'["q/a"]', b"on_dependency_failure": b"run", b"progress": progress, b"parent": b"q/p",
        b"not_a_field": b"ignored",
    }  # fmt: skip
    job = Job.from_hash("j", "q", fields)
    assert (job.id, job.queue, job.type, job.payload, job.state, job.content_type) == (
        "j", "q", "t", b"{}", State.HELD, "text/plain"
    )  # fmt: skip
    assert (job.attempt, job.max_attempts, job.timeout_ms, job.backoff_ms) == (2, 5, 1000, 2000)
    assert (job.created_ms, job.run_at_ms, job.started_ms, job.finished_ms) == (10, 20, 30, 40)
    assert (job.token, job.last_error, job.unique_key, job.unique_window) == ("tok", "boom", "u", False)
    assert (job.traceparent, job.meta, job.batch) == ("00-tp", {"m": "1"}, "b")
    assert (job.result, job.result_dropped) == (b"r", "oom")
    assert (job.cancel_requested, job.priority, job.expires_at_ms, job.keep_for_ms) == (True, 3, 50, 60)
    assert (job.debounce_key, job.schedule, job.scheduled_at_ms, job.limit_key) == ("d", "s", 70, "k")
    assert (job.held_for, job.held_at_ms, job.after, job.on_dependency_failure) == ("t#k", 80, ("q/a",), "run")
    assert job.progress is not None
    assert (job.progress.percent, job.progress.message) == (50.0, "half")
    assert job.parent == "q/p"
    # A field added to Job is read from the hash too: every one differs from its default here (unique_window
    # aside, tested below).
    defaults = Job("j", "q", "", b"", State.PENDING)
    same = [f.name for f in dataclasses.fields(Job) if getattr(job, f.name) == getattr(defaults, f.name)]
    assert same == ["id", "queue", "unique_window"]


def test_a_field_the_hash_lacks_keeps_the_jobs_default() -> None:
    job = Job.from_hash("j", "q", {b"payload": b"x"})
    assert job == Job("j", "q", "", b"x", State.PENDING)
    assert (job.content_type, job.attempt, job.meta, job.errors, job.after) == ("application/json", 0, {}, (), ())


def test_fields_read_only_in_context() -> None:
    """An empty content type is the default one; `held` counts only while the job is held; `unique_window`
    marks a window and names its key unless `unique` does; an empty `unique` names none."""
    assert Job.from_hash("j", "q", {b"content_type": b""}).content_type == "application/json"
    assert Job.from_hash("j", "q", {b"state": b"pending", b"held": b"t"}).held_for is None
    window = Job.from_hash("j", "q", {b"unique_window": b"w"})
    assert (window.unique_key, window.unique_window) == ("w", True)
    both = Job.from_hash("j", "q", {b"unique": b"u", b"unique_window": b"w"})
    assert (both.unique_key, both.unique_window) == ("u", True)
    assert Job.from_hash("j", "q", {b"unique": b""}).unique_key is None
    assert Job.from_hash("j", "q", {b"cancel": b"0", b"meta": b""}).cancel_requested is False
