"""Fleet-wide concurrency limits with real daemons and a real handler that counts what it sees at once."""

from __future__ import annotations

import bisect
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from jobcar.client import Client
from jobcar.job import State
from tests.integration.daemon_harness import (
    DaemonProcess,
    Gauge,
    HandlerServer,
    Received,
    answer_ok,
    listen_url,
    scrape,
    value,
    write_config,
)
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for


def test_three_daemons_never_run_more_than_the_limit_and_a_killed_ones_slots_come_back_within_the_lease(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    gauge = Gauge(0.2)
    handler = {"url": handlers.url("/slow", gauge), "limits": {"concurrency": 5}}
    config = write_config(tmp_path, redis_server.url, namespace, {"slow": handler}, lease="3s")
    with redis_server.client() as r:
        ids = {info.id for info in Client(r, namespace=namespace).enqueue_many([("slow", n) for n in range(300)])}
        victim, *others = daemons = [DaemonProcess(config).start() for _ in range(3)]
        try:
            wait_for(lambda: len(gauge.finished_ids()) >= 100, timeout=60, what="a third of the jobs, by three")
            # The victim alone for a moment, so that it surely holds all five slots when it is killed.
            for daemon in others:
                daemon.stop()
            alone_from = len(gauge.finished_ids())
            wait_for(lambda: len(gauge.finished_ids()) >= alone_from + 10, timeout=30, what="the victim alone")
            others = [DaemonProcess(config).start(wait_ready=False) for _ in others]
            victim.signal(signal.SIGKILL)
            victim.wait()
            killed_at = time.monotonic()
            wait_for(lambda: gauge.finished_ids() == ids, timeout=120, what="every job to finish")
            keys = QueueDriver(r, namespace).keys
            wait_for(lambda: not r.exists(keys.limit_groups), timeout=10, what="every slot given back")
        finally:
            for daemon in (*daemons, *others):
                daemon.stop()
    # The victim's requests end 0.2 s after the kill; from then on only the two others run jobs, and they
    # can take its five slots only once the reaper has recovered its leases.
    after = killed_at + 0.5
    back_to_five = next(t for t, held in gauge.timeline if t > after and held == 5) - killed_at
    print(f"most at once: {gauge.most} of 5; five at once again {back_to_five:.2f} s after the kill (lease 3 s)")
    assert gauge.most == 5
    assert back_to_five < 3 + 2, "within the lease, plus a loaded machine's slack"


@pytest.mark.parametrize(
    "limits",
    [{"per_key": 2, "key": "meta.tenant"}, {"concurrency": 10, "fair": True, "key": "meta.tenant"}],
    ids=["per-key", "fair"],
)
def test_a_tenant_behind_another_tenants_backlog_runs_after_a_few_of_its_jobs(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer, limits: dict[str, Any]
) -> None:
    gauge = Gauge(0.01)
    handler = {"url": handlers.url("/work", gauge), "limits": limits}
    config = write_config(tmp_path, redis_server.url, namespace, {"work": handler}, concurrency=10)
    with redis_server.client() as r:
        client = Client(r, namespace=namespace)
        client.enqueue_many([("work", n, {"meta": {"tenant": "a"}}) for n in range(10_000)])
        b = {info.id for info in client.enqueue_many([("work", n, {"meta": {"tenant": "b"}}) for n in range(20)])}
        daemon = DaemonProcess(config).start()
        try:
            api = listen_url(daemon)
            labels = {"queue": "default", "type": "work"}
            wait_for(lambda: value(scrape(api), "jobcar_jobs_held", **labels) > 0, timeout=20, what="held in /metrics")
            wait_for(lambda: b <= gauge.finished_ids(), timeout=60, what="tenant b's jobs to finish")
            assert value(scrape(api), "jobcar_job_held_seconds_count", **labels) > 0, "jobs leased after a hold"
        finally:
            daemon.stop()
    with gauge.lock:
        order = [r.headers["jobcar-job-id"] in b for r in gauge.done]
    a_before_b_finished = order[: max(i for i, is_b in enumerate(order) if is_b)].count(False)
    print(f"tenant a ran {a_before_b_finished} of its 10,000 jobs before tenant b's 20 had all run ({limits})")
    # FIFO would run all 10,000 first. With per_key 2 each tenant runs two at a time, and with fair the two
    # take turns: a runs about as many as b meanwhile, plus what ran before the lease had held a's backlog
    # (1,000 held per lease call).
    assert a_before_b_finished <= 100


@pytest.mark.parametrize("source", ["key", "payload.tenant"])
def test_per_key_limits_and_a_total_hold_across_two_daemons(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer, source: str
) -> None:
    per_tenant = {t: Gauge(0.05) for t in "xyz"}
    total = Gauge(0)

    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        total.enter()
        try:
            return per_tenant[json.loads(req.body)["tenant"]](req)
        finally:
            total.leave(req)

    handler = {"url": handlers.url("/t", route), "limits": {"per_key": 2, "key": source, "concurrency": 5}}
    config = write_config(tmp_path, redis_server.url, namespace, {"t": handler})
    by_producer = source == "key"
    jobs = [("t", {"tenant": t, "n": n}, {"key": t} if by_producer else {}) for n in range(15) for t in "xyz"]
    with redis_server.client() as r:
        Client(r, namespace=namespace).enqueue_many(jobs)
        daemons = [DaemonProcess(config).start() for _ in range(2)]
        try:
            wait_for(lambda: len(total.done) == len(jobs), timeout=60, what="every job to finish")
        finally:
            for daemon in daemons:
                daemon.stop()
    assert [per_tenant[t].most for t in "xyz"] == [2, 2, 2]
    assert total.most == 5


@pytest.mark.soak
def test_a_rate_limit_holds_across_three_daemons_for_twenty_seconds(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    rate, burst, seconds = 50, 5, 20
    handler = {"url": handlers.url("/rated", answer_ok), "limits": {"rate": f"{rate}/s", "burst": burst}}
    config = write_config(tmp_path, redis_server.url, namespace, {"rated": handler}, result_ttl="1h")
    with redis_server.client() as r:
        q = QueueDriver(r, namespace)
        ids = [info.id for info in q.producer.enqueue_many([("rated", n) for n in range(rate * seconds * 2)])]
        daemons = [DaemonProcess(config).start() for _ in range(3)]
        try:
            first = q.now_ms()
            wait_for(lambda: q.now_ms() - first >= seconds * 1000, timeout=seconds + 30, what=f"{seconds} s of work")
        finally:
            for daemon in daemons:
                daemon.stop()
        # Lease times in Redis time, as the script took them (the handler's receive times add network jitter).
        starts = sorted(job.started_ms for i in ids if (job := q.job(i)) is not None and job.started_ms is not None)
    span = (starts[-1] - starts[0]) / 1000
    observed = (len(starts) - burst) / span
    densest = max(bisect.bisect_left(starts, t + 1000) - n for n, t in enumerate(starts))
    print(f"{len(starts)} starts in {span:.1f} s: {observed:.1f}/s after the burst (limit {rate}/s), {densest} in the "
          "densest second")  # fmt: skip
    assert abs(observed - rate) <= rate * 0.1
    assert densest <= rate + burst, "GCRA: any second holds at most a burst more than the rate"


def test_a_429_with_retry_after_holds_its_key_back_for_that_long(
    redis_server: RedisServer, namespace: str, tmp_path: Path, handlers: HandlerServer
) -> None:
    busy_job: list[str] = []
    received: list[tuple[float, str]] = []
    watcher = QueueDriver(redis_server.client(), namespace)

    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        tenant = json.loads(req.body)["tenant"]
        received.append((time.monotonic(), tenant))
        if tenant == "x" and not busy_job:
            busy_job.append(req.headers["jobcar-job-id"])
            return 429, {"Retry-After": "2"}, b"slow down"
        if tenant == "y":
            # The 429 is recorded while y runs, so the next x job is leased after it (one job at a time):
            # jobs leased before a 429 is recorded run on, by design.
            wait_for(lambda: watcher.where(busy_job[0]) is State.SCHEDULED, what="the 429 to be recorded")
        return 200, {}, b"ok"

    handler = {"url": handlers.url("/busy", route), "limits": {"on_429": "key", "key": "payload.tenant"}}
    config = write_config(tmp_path, redis_server.url, namespace, {"busy": handler}, concurrency=1)
    with redis_server.client() as r, watcher.redis:
        q = QueueDriver(r, namespace)
        q.producer.enqueue_many([("busy", {"tenant": t}) for t in ("x", "y", "x", "y")])
        daemon = DaemonProcess(config).start()
        try:
            wait_for(lambda: len(received) == 5, timeout=30, what="every job, the 429 one twice")
        finally:
            daemon.stop()
    busy_at = received[0][0]
    x_after = [at - busy_at for at, tenant in received[1:] if tenant == "x"]
    y_after = [at - busy_at for at, tenant in received if tenant == "y"]
    print(f"after the 429: x at {x_after}, y at {y_after} (s)")
    assert received[0][1] == "x"
    assert all(at >= 2 - 0.05 for at in x_after), "no job of the key before the Retry-After"
    assert all(at < 2 for at in y_after), "the other key runs meanwhile"
