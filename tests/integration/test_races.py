"""Races at the lease boundary (guarantee #4 of docs/delivery-semantics.md) and concurrent unique enqueues
(#13), on real Redis."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import redis

from jobcar import EnqueueStatus, State, transitions, transport
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer

ROUNDS = 100
JOBS_PER_ROUND = 100  # 10,000 ack-vs-reap races in all


def _race_one_round(
    acker: QueueDriver, reapers: tuple[QueueDriver, QueueDriver], lease_ms: int
) -> tuple[list[transitions.LeasedJob], dict[str, int], list[dict[str, str]]]:
    """Lease a round of jobs, then ack them one by one while both reapers run: (leased, acks, reaps)."""
    acker.producer.enqueue_many([("race", None)] * JOBS_PER_ROUND)
    leased = acker.lease(count=JOBS_PER_ROUND, lease_ms=lease_ms).jobs
    assert len(leased) == JOBS_PER_ROUND
    acked: dict[str, int] = {}
    reaped: list[dict[str, str]] = [{}, {}]
    done = threading.Event()

    def ack_all() -> None:
        for job in leased:
            acked[job.job.id] = acker.ack(job.job.id, job.token)
        done.set()

    def reap_until_done(reaper: QueueDriver, into: dict[str, str]) -> None:
        while True:
            finished = done.is_set()  # read before reaping: one more pass after the last ack
            for job_id, where in reaper.reap().items():
                assert job_id not in into, f"{job_id} reaped twice by one reaper"
                into[job_id] = where
            if finished:
                return

    with ThreadPoolExecutor(3) as pool:
        futures = [
            pool.submit(ack_all),
            *(pool.submit(reap_until_done, r, d) for r, d in zip(reapers, reaped, strict=True)),
        ]
        for f in futures:
            f.result()
    return leased, acked, reaped


def test_ack_versus_two_reapers_at_the_lease_boundary(redis_server: RedisServer, namespace: str) -> None:
    """Each round leases 100 jobs with a lease of a few ms; one thread acks them one by one while two
    threads reap concurrently, so the deadline passes in the middle of the acks. Every job must end
    exactly one way: acked (gone, never requeued) or reaped once (pending, attempt counted once)."""
    clients = [redis_server.client() for _ in range(3)]
    acker, reaper_a, reaper_b = (QueueDriver(c, namespace) for c in clients)
    outcomes: Counter[str] = Counter()
    lease_ms = 5  # adjusted every round to keep the deadline in the middle of the acks
    try:
        for _ in range(ROUNDS):
            leased, acked, reaped = _race_one_round(acker, (reaper_a, reaper_b), lease_ms)
            assert not reaped[0].keys() & reaped[1].keys(), "two reapers recovered the same lease"
            all_reaped = reaped[0] | reaped[1]
            lease_ms = max(1, lease_ms + (1 if len(all_reaped) > JOBS_PER_ROUND // 2 else -1))
            for job in leased:
                job_id = job.job.id
                if acked[job_id] == 1:
                    assert job_id not in all_reaped, f"{job_id} was acked and also requeued"
                    assert acker.where(job_id) is None
                    outcomes["acked"] += 1
                else:
                    assert all_reaped.get(job_id) == "pending", f"{job_id}: ack lost but not reaped"
                    recovered = acker.job(job_id)
                    assert recovered is not None
                    assert recovered.attempt == 1
                    assert recovered.token is None
                    assert acker.where(job_id) is State.PENDING
                    outcomes["reaped"] += 1
            # Drain the reaped jobs so the next round starts from an empty queue.
            again = acker.lease(count=JOBS_PER_ROUND).jobs
            assert all(job.job.attempt == 2 for job in again), "attempt += 1 exactly once per lease"
            if again:
                acks = [transitions.ack_call(acker.keys, job.job.id, job.token) for job in again]
                [reply] = transport.execute(acker.redis, [transitions.merge_acks(acks)])
                assert transitions.parse_ack(reply) == [1] * len(again)
    finally:
        for c in clients:
            c.close()
    assert outcomes["acked"] + outcomes["reaped"] == ROUNDS * JOBS_PER_ROUND
    # Both sides of the race must really have happened, or the test proved nothing.
    assert outcomes["acked"] > ROUNDS, outcomes
    assert outcomes["reaped"] > ROUNDS, outcomes


def test_fifty_concurrent_enqueues_with_one_unique_key_make_one_job(
    any_redis: redis.Redis | redis.RedisCluster, namespace: str
) -> None:
    driver = QueueDriver(any_redis, namespace)
    barrier = threading.Barrier(50)

    def enqueue(n: int) -> tuple[EnqueueStatus, str]:
        barrier.wait()
        info = driver.producer.enqueue("invoice.send", {"n": n}, unique_key="invoice-7", unique_for=60)
        return info.status, info.id

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(enqueue, range(50)))
    created = [job_id for status, job_id in results if status is EnqueueStatus.CREATED]
    assert len(created) == 1
    assert all(job_id == created[0] for _, job_id in results), "every duplicate names the one job"
    assert any_redis.llen(driver.keys.pending) == 1
    stored = {k for k in any_redis.scan_iter(match=driver.keys.prefix + "job:*")}  # type: ignore[misc]
    assert stored == {driver.keys.job(created[0]).encode()}
