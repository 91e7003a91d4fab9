"""The producer's dedupe window (`keep_for`): a finished job's id is kept past the daemon's result_ttl, so an
enqueue of the same id (a Spark task retried hours later) answers exists and adds nothing."""

from __future__ import annotations

from pathlib import Path

from jobcar import EnqueueStatus, State
from jobcar.job_document import job_document
from tests.integration.conftest import StartDaemon
from tests.integration.driver import QueueDriver
from tests.servers import wait_for

HOUR_MS = 3_600_000


def test_a_window_keeps_the_id_and_result_of_a_job_acked_with_no_retention_without_its_payload(
    q: QueueDriver,
) -> None:
    q.enqueue("t", {"order": 1}, job_id="kept", keep_for="1h", batch="b", meta={"m": "v"})
    q.enqueue("t", {"order": 2}, job_id="plain", batch="b")
    leased = {j.job.id: j for j in q.lease().jobs}
    assert leased["kept"].job.keep_for_ms == HOUR_MS
    assert q.ack("kept", leased["kept"].token, result=b"42") == 1
    assert q.ack("plain", leased["plain"].token) == 1
    assert q.redis.exists(q.keys.job("plain")) == 0
    job = q.job("kept")
    assert job is not None
    assert (job.state, job.result, job.payload, job.meta, job.batch) == (State.DONE, b"42", b"", {}, "b")
    assert job.finished_ms is not None
    assert HOUR_MS - 5_000 < q.redis.pttl(q.keys.job("kept")) <= HOUR_MS
    assert q.sets_of("kept") == []  # in no state set: only its hash is left
    document = job_document(job)
    assert (document["state"], document["payload"], document["result"]) == ("done", None, "42")
    assert "payload_base64" not in document

    again = q.enqueue("t", {"order": 1}, job_id="kept", keep_for="1h", batch="b")
    assert (again.status, again.state) == (EnqueueStatus.EXISTS, State.DONE)
    assert q.redis.llen(q.keys.pending) == 0
    assert q.redis.hget(q.keys.batch("b"), "total") == b"2", "an existing id is not counted in its batch again"
    # The id of the job kept by no window is free: the retried enqueue creates it again.
    assert q.enqueue("t", {"order": 2}, job_id="plain", batch="b").status is EnqueueStatus.CREATED


def test_the_longer_of_result_ttl_and_the_window_keeps_the_whole_job(q: QueueDriver) -> None:
    q.enqueue("t", {"order": 1}, job_id="short", keep_for="1s")
    q.enqueue("t", {"order": 2}, job_id="long", keep_for="1h")
    leased = {j.job.id: j for j in q.lease().jobs}
    for job_id in ("short", "long"):
        assert q.ack(job_id, leased[job_id].token, result=b"r", retention_ms=60_000) == 1
    assert 55_000 < q.redis.pttl(q.keys.job("short")) <= 60_000
    assert HOUR_MS - 5_000 < q.redis.pttl(q.keys.job("long")) <= HOUR_MS
    for job_id, payload in (("short", b'{"order":1}'), ("long", b'{"order":2}')):
        job = q.job(job_id)
        assert job is not None
        assert (job.state, job.payload, job.result) == (State.DONE, payload, b"r")  # kept as result_ttl keeps it


def test_a_canceled_ack_keeps_the_id_too(q: QueueDriver) -> None:
    q.enqueue(job_id="c", keep_for="10m")
    leased = q.lease_one()
    assert q.ack("c", leased.token, final=State.CANCELED) == 1
    assert q.enqueue(job_id="c").status is EnqueueStatus.EXISTS


def test_under_a_daemon_with_result_ttl_0_a_kept_job_runs_once_and_its_id_answers_exists(
    start_daemon: StartDaemon, q: QueueDriver, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    start_daemon({"count": {"command": ["sh", "-c", f"echo run >> {runs}; echo 7"]}}, result_ttl="0s")
    q.enqueue("count", {}, job_id="once", keep_for="2h")
    q.enqueue("count", {}, job_id="twice")
    wait_for(lambda: runs.exists() and runs.read_text().count("run") == 2, what="both jobs to run")
    wait_for(lambda: q.redis.exists(q.keys.job("twice")) == 0, what="the job kept by no window to go")
    job = q.job("once")
    assert job is not None
    assert (job.state, job.result) == (State.DONE, b"7\n")
    assert q.enqueue("count", {}, job_id="once", keep_for="2h").status is EnqueueStatus.EXISTS
    assert q.enqueue("count", {}, job_id="twice").status is EnqueueStatus.CREATED
    wait_for(lambda: runs.read_text().count("run") == 3, what="the re-created job to run")
    assert q.job("once") is not None
