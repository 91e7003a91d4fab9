"""A workflow run by real daemons against a real handler that fails some first attempts, with one daemon
`kill -9`ed mid-run: every job runs, and none before the jobs it waits for are done."""

from __future__ import annotations

import json
import signal
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from jobcar.client import Client
from tests.integration.daemon_harness import DaemonProcess, HandlerServer, Received, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for


class Steps:
    """The handler: holds each job a moment, fails the first attempt of every fourth job (by id), and
    records when each attempt started and when each job succeeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, float] = {}  # job id -> its first start
        self.succeeded: dict[str, float] = {}  # job id -> its first success
        self.successes: dict[str, int] = {}
        self.after: dict[str, str | None] = {}  # job id -> its Jobcar-After header
        self.attempts: dict[str, list[int]] = {}  # job id -> the attempt of each of its requests, in order

    def __call__(self, req: Received) -> tuple[int, dict[str, str], bytes]:
        job_id, attempt = req.headers["jobcar-job-id"], int(req.headers["jobcar-attempt"])
        with self.lock:
            self.started.setdefault(job_id, time.monotonic())
            self.after[job_id] = req.headers.get("jobcar-after")
            self.attempts.setdefault(job_id, []).append(attempt)
        time.sleep(0.05)
        if attempt == 1 and zlib.crc32(job_id.encode()) % 4 == 0:
            return 500, {}, b"flaky"
        with self.lock:
            self.succeeded.setdefault(job_id, time.monotonic())
            self.successes[job_id] = self.successes.get(job_id, 0) + 1
        return 200, {}, b"ok"


def workflow() -> tuple[list[tuple[str, Any, dict[str, Any]]], dict[str, list[str]]]:
    """50 jobs: a root, then three times a fan-out of 10, their fan-in and a chain of 5, then a last job;
    with each job's dependencies, by id."""
    jobs: list[tuple[str, Any, dict[str, Any]]] = []
    after: dict[str, list[str]] = {}

    def add(job_id: str, deps: list[str]) -> str:
        jobs.append(("step", job_id, {"job_id": job_id, **({"after": deps} if deps else {})}))
        after[job_id] = deps
        return job_id

    tail = add("root", [])
    for layer in range(3):
        parts = [add(f"l{layer}-part{n}", [tail]) for n in range(10)]
        tail = add(f"l{layer}-fan-in", parts)
        for n in range(5):
            tail = add(f"l{layer}-chain{n}", [tail])
    add("last", [tail])
    return jobs, after


def test_a_dag_of_50_runs_in_order_through_failures_and_a_killed_daemon(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    steps = Steps()
    config = write_config(tmp_path, redis_server.url, namespace, {"step": {"url": handlers.url("/step", steps)}},
                          lease="2s", concurrency=4)  # fmt: skip
    jobs, after = workflow()
    assert len(jobs) == 50
    with redis_server.client() as r:
        Client(r, namespace=namespace).enqueue_many(jobs)
        victim, other = daemons = [DaemonProcess(config).start() for _ in range(2)]
        try:
            wait_for(lambda: len(steps.succeeded) >= 15, timeout=60, what="a third of the workflow")
            victim.signal(signal.SIGKILL)
            victim.wait()
            wait_for(lambda: len(steps.succeeded) == 50, timeout=90, what=f"every step ({other.log_tail()})")
            q = QueueDriver(r, namespace)
            wait_for(lambda: not r.exists(q.keys.settled), timeout=10, what="every dependency carried")
            assert not r.exists(q.keys.waiting)
        finally:
            for daemon in daemons:
                daemon.stop()
    for job_id, deps in after.items():
        for dep in deps:
            assert steps.started[job_id] > steps.succeeded[dep], f"{job_id} started before {dep} was done"
        # What it ran after comes with it (a fan-in of 10 too: at most 16 go in the header).
        assert steps.after[job_id] == (" ".join(f"default/{d}" for d in deps) or None)
    # Each job was released once: its requests are its attempts one after the other (a second release
    # would start again at attempt 1). Only a job the killed daemon held when it died ran again (at most 4).
    for job_id, attempts in steps.attempts.items():
        assert attempts == sorted(set(attempts)), f"{job_id} ran as attempts {attempts}"
    again = [job_id for job_id, n in steps.successes.items() if n > 1]
    assert len(again) <= 4, steps.successes
    assert all(steps.successes[j] == 2 for j in again), steps.successes


def test_a_batch_whose_last_two_jobs_end_at_once_on_two_daemons_calls_back_once(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    together = threading.Barrier(2, timeout=20)  # each pair of jobs answers at the same moment
    callbacks: list[dict[str, Any]] = []

    def part(req: Received) -> tuple[int, dict[str, str], bytes]:
        together.wait()
        return 200, {}, b"ok"

    def callback(req: Received) -> tuple[int, dict[str, str], bytes]:
        callbacks.append(json.loads(req.body))
        return 200, {}, b"ok"

    handler = {"part": {"url": handlers.url("/part", part)}, "report": {"url": handlers.url("/report", callback)}}
    # One job at a time per daemon (leased one at a time too): a pair's two jobs run on the two daemons.
    config = write_config(tmp_path, redis_server.url, namespace, handler, concurrency=1)
    batches = [f"b{n}" for n in range(5)]
    with redis_server.client() as r:
        client = Client(r, namespace=namespace)
        for batch in batches:  # two jobs each: one daemon runs one, the other daemon the other
            client.enqueue_many([("part", None, {"batch": batch}), ("part", None, {"batch": batch})])
            client.seal_batch(batch, on_complete=("report", batch))
        daemons = [DaemonProcess(config).start() for _ in range(2)]
        try:
            wait_for(lambda: len(callbacks) >= len(batches), timeout=60, what="every batch's callback")
            q = QueueDriver(r, namespace)
            wait_for(lambda: not r.exists(q.keys.settled), timeout=10, what="every entry carried")
        finally:
            for daemon in daemons:
                daemon.stop()
    assert sorted(c["data"] for c in callbacks) == batches, "one callback per batch"
    assert all(c["batch"]["done"] == c["batch"]["total"] == 2 for c in callbacks)
    # The barrier let no part answer alone: every pair ran on the two daemons at once, and no part ran again.
    assert len(handlers.requests_to("/part")) == 2 * len(batches)


def test_a_chains_next_step_reads_the_result_of_the_one_before(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    with redis_server.client() as r:
        client = Client(r, namespace=namespace)
        read: list[bytes | None] = []

        def extract(req: Received) -> tuple[int, dict[str, str], bytes]:
            return 200, {}, b'{"rows": 42}'

        def load(req: Received) -> tuple[int, dict[str, str], bytes]:
            # What a handler of the next step does: the header names the step before, kept for result_ttl.
            queue, _, job_id = req.headers["jobcar-after"].partition("/")
            before = client.get(job_id, queue=queue)
            read.append(None if before is None else before.result)
            return 200, {}, b"loaded"

        handler = {"extract": {"url": handlers.url("/extract", extract)}, "load": {"url": handlers.url("/load", load)}}
        config = write_config(tmp_path, redis_server.url, namespace, handler, result_ttl="1m")
        _, last = client.chain([("extract", None), ("load", None)])
        daemon = DaemonProcess(config).start()
        try:
            wait_for(lambda: (job := client.get(last.id)) is not None and job.result == b"loaded", timeout=20,
                     what=f"the chain ({daemon.log_tail()})")  # fmt: skip
        finally:
            daemon.stop()
    assert read == [b'{"rows": 42}']
