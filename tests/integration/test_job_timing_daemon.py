"""Priority, start deadlines and debounce as a handler sees them: a real daemon, a real HTTP handler."""

from __future__ import annotations

import json
import random
import threading
import time

from jobcar import State
from jobcar.transitions import pause_call
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import HandlerServer, answer_ok, wait_state
from tests.integration.driver import QueueDriver
from tests.integration.test_operations import listen_url, scrape, value
from tests.servers import wait_for


def seen(handlers: HandlerServer, path: str) -> list[dict[str, int]]:
    return [json.loads(r.body) for r in handlers.requests_to(path)]


def test_concurrent_producers_jobs_run_in_priority_order_fifo_within_each(
    start_daemon: StartDaemon, handlers: HandlerServer, q: QueueDriver
) -> None:
    q.run(pause_call(q.keys, True))  # everything is enqueued before the first lease
    picks = random.Random(18)
    plans = [[picks.randrange(10) for _ in range(15)] for _ in range(4)]

    def produce(producer: int) -> None:
        for n, priority in enumerate(plans[producer]):
            q.enqueue("work", {"producer": producer, "n": n, "priority": priority}, priority=priority)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(len(plans))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    daemon = start_daemon({"work": {"url": handlers.url("/work", answer_ok)}}, concurrency=1)
    q.run(pause_call(q.keys, False))
    wait_for(lambda: len(handlers.requests_to("/work")) == 60, timeout=30, what=f"60 runs\n{daemon.log_tail()}")
    runs = seen(handlers, "/work")
    assert [r["priority"] for r in runs] == sorted(r["priority"] for r in runs)
    for producer in range(len(plans)):
        for priority in range(10):
            ns = [r["n"] for r in runs if (r["producer"], r["priority"]) == (producer, priority)]
            assert ns == sorted(ns), f"producer {producer}'s priority-{priority} jobs ran out of order: {ns}"


def test_expired_jobs_never_reach_the_handler(
    start_daemon: StartDaemon, handlers: HandlerServer, q: QueueDriver
) -> None:
    q.run(pause_call(q.keys, True))
    expiring = [q.enqueue("work", {"n": n}, expires_in=0.2).id for n in range(5)]
    lasting = [q.enqueue("work", {"n": n}, expires_in=600).id for n in range(5, 10)]
    deadline = max(q.job(i).expires_at_ms for i in expiring)  # type: ignore[union-attr]
    wait_for(lambda: q.now_ms() > deadline, timeout=10, what="the deadlines to pass")
    daemon = start_daemon({"work": {"url": handlers.url("/work", answer_ok)}})
    q.run(pause_call(q.keys, False))
    for job_id in expiring:
        job = wait_state(q, job_id, State.DEAD, daemon)
        assert job.attempt == 0, "never started"
        assert job.last_error is not None
        assert job.last_error.startswith("expired: not started by its deadline")
    wait_for(lambda: all(q.job(i) is None for i in lasting), timeout=20, what=f"the rest\n{daemon.log_tail()}")
    assert sorted(r["n"] for r in seen(handlers, "/work")) == [5, 6, 7, 8, 9]
    assert value(scrape(listen_url(daemon)), "jobcar_jobs_expired_total", queue="default") == 5


def test_a_steady_stream_of_debounced_enqueues_still_runs_every_max_wait(
    start_daemon: StartDaemon, handlers: HandlerServer, q: QueueDriver
) -> None:
    start_daemon({"refresh": {"url": handlers.url("/refresh", answer_ok)}})
    # An enqueue every 50 ms, far inside the 1 s quiet period: debounce alone would never let it run.
    n = 0
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        q.enqueue("refresh", {"n": n}, debounce=1.0, debounce_max_wait=1.2)
        n += 1
        time.sleep(0.05)
    runs_during_stream = len(handlers.requests_to("/refresh"))
    wait_for(lambda: seen(handlers, "/refresh")[-1:] == [{"n": n - 1}], timeout=10, what="the last payload to run")
    runs = [r["n"] for r in seen(handlers, "/refresh")]
    assert runs_during_stream >= 2, f"max_wait should have run the job during the stream: {runs}"
    assert runs == sorted(set(runs)), "each run takes the newest payload, none twice"
