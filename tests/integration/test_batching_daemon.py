"""Batched delivery with a real daemon: many jobs in one POST or one command run, each with its own outcome."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jobcar import transitions
from jobcar.client import Client
from jobcar.job import State
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import DaemonProcess, HandlerServer, Received, Route, wait_state
from tests.integration.driver import QueueDriver
from tests.servers import wait_for


def _answer(item: dict[str, Any]) -> dict[str, Any] | None:
    """What the handlers below answer for one job, by the payload's `do` and the attempt."""
    do, first = item["payload"]["do"], item["attempt"] == 1
    if do == "fail":
        return {"id": item["id"], "outcome": "fail", "error": "bad row"}
    if do == "retry" and first:
        return {"id": item["id"], "outcome": "retry", "error": "try later", "retry_after": 0.1}
    if do == "skip" and first:
        return None  # no answer at all: that job's failure, never its success
    if do == "garbage" and first:
        return {"id": item["id"], "outcome": "maybe"}
    return {"id": item["id"], "outcome": "done", "result": {"n": item["payload"]["n"]}}


_KINDS = ("done", "fail", "retry", "skip", "garbage")


def all_done(req: Received) -> tuple[int, dict[str, str], bytes]:
    """A batch route that answers every job of the call done."""
    return 200, {}, json.dumps([{"id": job["id"], "outcome": "done"} for job in json.loads(req.body)]).encode()


def held_until(release: threading.Event) -> Route:
    """A batch route that holds each call until `release` is set (20 s at most), then answers all done."""

    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        release.wait(20)
        return all_done(req)

    return route


def _check_outcomes(q: QueueDriver, ids: dict[str, str], daemon: DaemonProcess) -> None:
    jobs = {do: wait_state(q, ids[do], State.DEAD if do == "fail" else State.DONE, daemon) for do in _KINDS}
    assert jobs["done"].attempt == 1
    assert json.loads(jobs["done"].result or b"") == {"n": 0}
    assert jobs["fail"].attempt == 1
    assert jobs["fail"].last_error == "bad row"
    assert [e.error for e in jobs["retry"].errors] == ["try later"]
    assert jobs["retry"].attempt == 2
    assert jobs["skip"].attempt == 2
    assert "no answer" in jobs["skip"].errors[0].error
    assert jobs["garbage"].attempt == 2
    assert "outcome must be one of done, retry, fail" in jobs["garbage"].errors[0].error


def test_one_post_carries_the_batch_and_each_job_gets_its_own_outcome(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        answers = [a for a in map(_answer, json.loads(req.body)) if a is not None]
        return 200, {"Content-Type": "application/json"}, json.dumps(answers).encode()

    ids = {do: client.enqueue("rows", {"do": do, "n": n}).id for n, do in enumerate(_KINDS)}
    batch = {"max_size": 5, "max_wait": "1s"}
    daemon = start_daemon({"rows": {"url": handlers.url("/rows", route), "batch": batch}}, result_ttl="1h")
    _check_outcomes(q, ids, daemon)
    first, *later = handlers.requests_to("/rows")
    items = json.loads(first.body)
    assert first.headers["jobcar-batch-size"] == "5"
    assert first.headers["content-type"] == "application/json"
    assert sorted(item["id"] for item in items) == sorted(ids.values()), "the five jobs in one POST"
    assert {item["payload"]["do"] for item in items} == set(_KINDS)
    assert {item["attempt"] for item in items} == {1}
    # The three retried jobs come back together on their second attempt.
    assert sorted(item["payload"]["do"] for req in later for item in json.loads(req.body)) == [
        "garbage",
        "retry",
        "skip",
    ]


def test_a_batch_that_times_out_or_gets_a_5xx_retries_every_job_in_it(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    calls: list[int] = []
    release = threading.Event()

    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        calls.append(len(json.loads(req.body)))
        if len(calls) == 1:
            release.wait(5)  # past the handler's 1 s timeout
            return 200, {}, b"[]"
        if len(calls) == 2:
            return 503, {}, b"overloaded"
        return all_done(req)

    ids = [info.id for info in client.enqueue_many([("rows", n) for n in range(4)])]
    handler = {"url": handlers.url("/rows", route), "timeout": "1s", "batch": {"max_size": 4, "max_wait": "5s"}}
    daemon = start_daemon({"rows": handler}, result_ttl="1h")
    try:
        jobs = [wait_state(q, job_id, State.DONE, daemon) for job_id in ids]
    finally:
        release.set()
    assert calls == [4, 4, 4]
    for job in jobs:
        assert job.attempt == 3
        assert job.errors[0].error.startswith("timeout after 1.0s (the whole batch of 4)")
        assert job.errors[1].error == "HTTP 503 Service Unavailable: overloaded"


_COMMAND = """
import json, sys
for line in sys.stdin:
    job = json.loads(line)
    do = job["payload"]["do"]
    if do == "crash" and job["attempt"] == 1:
        sys.stdout.flush()
        print("the row broke me", file=sys.stderr)
        sys.exit(3)
    print("a log line that is no answer")
    answer = {"id": job["id"], "outcome": "done", "result": job["payload"]["n"]}
    if do == "fail":
        answer = {"id": job["id"], "outcome": "fail", "error": "bad row"}
    elif do == "retry" and job["attempt"] == 1:
        answer = {"id": job["id"], "outcome": "retry", "error": "try later"}
    print(json.dumps(answer), flush=True)
"""


def test_one_command_run_carries_the_batch_and_answers_printed_before_a_crash_count(
    tmp_path: Path, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    script = tmp_path / "rows.py"
    script.write_text(_COMMAND)
    kinds = ("done", "fail", "retry", "crash", "after")  # "after" follows the crash in the same run
    records = [("rows", {"do": do, "n": n}, {"job_id": do}) for n, do in enumerate(kinds)]
    client.enqueue_many(records)
    handler = {"command": [sys.executable, str(script)], "batch": {"max_size": 5, "max_wait": "1s"}}
    daemon = start_daemon({"rows": handler}, result_ttl="1h")
    done = {do: wait_state(q, do, State.DEAD if do == "fail" else State.DONE, daemon) for do in kinds}
    assert done["done"].attempt == 1
    assert done["done"].result == b"0"
    assert done["fail"].last_error == "bad row"
    assert [e.error for e in done["retry"].errors] == ["try later"]
    for do in ("crash", "after"):  # no answer line before the exit: the run's own outcome
        assert done[do].attempt == 2
        assert done[do].errors[0].error.startswith("exit code 3")
        assert "the row broke me" in done[do].errors[0].error


def test_jobs_of_different_keys_or_timeouts_never_share_a_batch_and_no_batch_exceeds_max_size(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    client.enqueue_many([("rows", n, {"meta": {"tenant": "ab"[n % 2]}}) for n in range(46)])
    hurried = {
        i.id for i in client.enqueue_many([("rows", n, {"meta": {"tenant": "a"}, "timeout": 5}) for n in range(4)])
    }
    batch = {"max_size": 10, "max_wait": "300ms", "key": "meta.tenant"}
    start_daemon({"rows": {"url": handlers.url("/rows", all_done), "batch": batch}})
    wait_for(lambda: sum(len(json.loads(r.body)) for r in handlers.requests_to("/rows")) == 50, timeout=30,
             what="all 50 jobs delivered")  # fmt: skip
    batches = [json.loads(r.body) for r in handlers.requests_to("/rows")]
    assert all(len({item["meta"]["tenant"] for item in b}) == 1 for b in batches)
    assert [b for b in batches if {item["id"] for item in b} & hurried] == [
        b for b in batches if {item["id"] for item in b} <= hurried
    ], "a job with a timeout of its own shares a batch only with jobs of the same timeout"
    assert max(len(b) for b in batches) == 10
    wait_for(lambda: q.redis.zcard(q.keys.active) == 0, timeout=10, what="every job acked")


def test_a_drain_gives_a_forming_batch_back_without_calling_the_handler_or_spending_attempts(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    ids = [info.id for info in client.enqueue_many([("rows", n) for n in range(3)])]
    batch = {"max_size": 10, "max_wait": "60s"}
    handler = {"url": handlers.url("/rows", lambda req: (200, {}, b"[]")), "batch": batch}
    daemon = start_daemon({"rows": handler}, shutdown_timeout="60s")
    wait_for(lambda: q.redis.zcard(q.keys.active) == 3, timeout=10, what="the three jobs leased into a forming batch")
    signalled = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0
    # Given back at once: neither the batch's max_wait nor the drain's shutdown_timeout (a minute each).
    assert time.monotonic() - signalled < 30
    assert handlers.requests_to("/rows") == []
    for job_id in ids:
        job = q.job(job_id)
        assert job is not None
        assert (job.state, job.attempt) == (State.PENDING, 0)


def test_a_job_canceled_while_its_batch_runs_ends_canceled_when_the_call_ends_and_the_others_are_done(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    release = threading.Event()
    victim, *others = [info.id for info in client.enqueue_many([("rows", n) for n in range(3)])]
    batch = {"max_size": 3, "max_wait": "5s"}
    handler = {"url": handlers.url("/rows", held_until(release)), "batch": batch}
    daemon = start_daemon({"rows": handler}, result_ttl="1h")
    try:
        wait_for(lambda: len(handlers.requests_to("/rows")) == 1, timeout=10, what="the batch's call")
        q.run(transitions.cancel_call(q.keys, victim))
        daemon.wait_for_log("job stopped while its batch's call runs")
        job = q.job(victim)
        assert job is not None
        assert job.state is State.ACTIVE, "its call still runs: the job ends with it"
    finally:
        release.set()
    assert wait_state(q, victim, State.CANCELED, daemon).result is None
    for job_id in others:
        wait_state(q, job_id, State.DONE, daemon)


def test_a_drain_past_its_grace_aborts_the_batchs_call_and_gives_every_job_back_unspent(
    handlers: HandlerServer, start_daemon: StartDaemon, client: Client, q: QueueDriver
) -> None:
    release = threading.Event()
    ids = [info.id for info in client.enqueue_many([("rows", n) for n in range(3)])]
    batch = {"max_size": 3, "max_wait": "5s"}
    handler = {"url": handlers.url("/rows", held_until(release)), "batch": batch}
    daemon = start_daemon({"rows": handler}, shutdown_timeout="500ms")
    try:
        wait_for(lambda: len(handlers.requests_to("/rows")) == 1, timeout=10, what="the batch's call")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait() == 0
    finally:
        release.set()
    for job_id in ids:
        job = q.job(job_id)
        assert job is not None
        assert (job.state, job.attempt) == (State.PENDING, 0)
