"""`jobcar run` against the local 3-master Redis Cluster: leasing, waking and draining end to end.

Each queue's keys share a hash tag, so a queue lives on one node; with several queues they spread
over the masters. The one-queue daemon leases behind its idle wait (ADR 0005), the multi-queue one
with a plain wait: both paths run here against Cluster's client.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobcar import Client, State
from tests.integration.daemon_harness import DaemonProcess, Gauge, HandlerServer, Received, wait_gone, write_config
from tests.integration.driver import QueueDriver
from tests.integration.lease_probe import LeaseMonitor, wait_for_a_queued_lease
from tests.servers import RedisServer, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(redis_cluster: list[RedisServer]) -> Iterator[redis.RedisCluster]:
    client = redis.RedisCluster(host="127.0.0.1", port=redis_cluster[0].port)
    yield client
    client.close()


def start(tmp_path: Path, nodes: list[RedisServer], namespace: str, url: str, **top: object) -> DaemonProcess:
    redis_config = {"url": nodes[0].url, "cluster": True}
    return DaemonProcess(write_config(tmp_path, "", namespace, {"t": {"url": url}}, redis=redis_config, **top)).start()


def test_a_one_queue_daemon_on_cluster_runs_jobs_as_they_come_and_when_due(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    url = handlers.url("/jobs/t", lambda req: (200, {}, b"ok"))
    daemon = start(tmp_path, redis_cluster, namespace, url)
    try:
        q = QueueDriver(cluster, namespace)
        node = cluster.get_node_from_key(q.keys.wake)
        [server] = [s for s in redis_cluster if s.port == node.port]
        with LeaseMonitor(server) as monitor:
            for n in range(5):  # one at a time, each arriving at an idle daemon
                wait_for_a_queued_lease(cluster.get_redis_connection(node), monitor)
                job = q.enqueue("t", n).id
                wait_gone(q, job, daemon)
                assert monitor.queued_lease_took(job)
        later = q.enqueue("t", "later", delay=0.3).id
        wait_gone(q, later, daemon)
        assert len(handlers.requests_to("/jobs/t")) == 6
        burst = [info.id for info in Client(cluster, namespace=namespace).enqueue_many([("t", n) for n in range(200)])]
        for job in burst:
            wait_gone(q, job, daemon)
    finally:
        daemon.stop()
    assert daemon.process is not None
    assert daemon.process.returncode == 0


def test_a_multi_queue_daemon_on_cluster_serves_every_queue_and_drains(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    url = handlers.url("/jobs/t", lambda req: (200, {}, b""))
    queues = {"a": 1, "b": 1, "c": 1}
    daemon = start(tmp_path, redis_cluster, namespace, url, queues=queues)
    client = Client(cluster, namespace=namespace)
    drivers = {name: QueueDriver(cluster, namespace, name) for name in queues}
    slots = {cluster.keyslot(d.keys.pending) for d in drivers.values()}
    nodes = {cluster.get_node_from_key(d.keys.pending).name for d in drivers.values()}
    assert len(slots) == 3, "the queues spread over the masters"
    assert len(nodes) >= 2, "the queues spread over the masters"
    for name, driver in drivers.items():
        job = client.enqueue("t", name, queue=name).id
        wait_gone(driver, job, daemon)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=30) == 0
    late = client.enqueue("t", "after", queue="b").id
    assert drivers["b"].where(late) is State.PENDING
    assert len(handlers.requests_to("/jobs/t")) == 3, "one request per queue"


def test_two_daemons_on_cluster_fire_each_tick_of_schedules_on_different_slots_once(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    url = handlers.url("/jobs/t", lambda req: (200, {}, b"ok"))
    queues = {"alpha": 1, "beta": 1, "gamma": 1}
    schedules = {f"every-{q}": {"every": "1s", "type": "t", "queue": q} for q in queues}
    assert len({cluster.keyslot(QueueDriver(cluster, namespace, q).keys.schedules) for q in queues}) == 3
    daemons = [start(tmp_path, redis_cluster, namespace, url, queues=queues, schedules=schedules) for _ in range(2)]
    try:
        client = Client(cluster, namespace=namespace)

        def fired() -> dict[str, int]:
            return {name: state.fires for name in schedules if (state := client.schedule(name)) is not None}

        wait_for(lambda: all(n >= 4 for n in fired().values()) and len(fired()) == 3, timeout=30, what="4 ticks each")
    finally:
        for daemon in daemons:
            daemon.stop()
    requests = handlers.requests_to("/jobs/t")
    ids = [r.headers["jobcar-job-id"] for r in requests if r.headers["jobcar-attempt"] == "1"]
    assert len(ids) == len(set(ids)), "a tick's job was made twice"
    for name in schedules:
        ticks = sorted(int(i.partition("@")[2]) for i in ids if i.startswith(f"{name}@"))
        assert ticks == list(range(ticks[0], ticks[0] + 1000 * len(ticks), 1000)), (name, ticks)


def test_two_daemons_on_cluster_hold_a_fleet_wide_limit(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    gauge = Gauge(0.05)
    handler = {"url": handlers.url("/jobs/t", gauge), "limits": {"concurrency": 3, "per_key": 1}}
    redis_config = {"url": redis_cluster[0].url, "cluster": True}
    config = write_config(tmp_path, "", namespace, {"t": handler}, redis=redis_config)
    jobs = Client(cluster, namespace=namespace).enqueue_many([("t", n, {"key": f"k{n % 4}"}) for n in range(40)])
    daemons = [DaemonProcess(config).start() for _ in range(2)]
    try:
        wait_for(lambda: gauge.finished_ids() == {j.id for j in jobs}, timeout=60, what="every job to finish")
    finally:
        for daemon in daemons:
            daemon.stop()
    assert gauge.most == 3


def test_batched_delivery_on_cluster_sends_one_queue_per_batch_and_records_each_jobs_outcome(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    def route(req: Received) -> tuple[int, dict[str, str], bytes]:
        jobs = json.loads(req.body)
        answers = [{"id": j["id"], "outcome": "fail" if j["payload"] == 0 else "done"} for j in jobs]
        return 200, {}, json.dumps(answers).encode()

    queues = {"a": 1, "b": 1}
    handler = {"url": handlers.url("/rows", route), "batch": {"max_size": 10, "max_wait": "300ms"}}
    redis_config = {"url": redis_cluster[0].url, "cluster": True}
    config = write_config(tmp_path, "", namespace, {"rows": handler}, redis=redis_config, queues=queues)
    client = Client(cluster, namespace=namespace)
    for name in queues:
        client.enqueue_many([("rows", n, {"queue": name}) for n in range(15)])
    daemon = DaemonProcess(config).start()
    try:
        drivers = [QueueDriver(cluster, namespace, name) for name in queues]
        wait_for(lambda: all(d.redis.zcard(d.keys.active) + d.redis.llen(d.keys.pending) == 0 for d in drivers),
                 timeout=30, what="every job finished")  # fmt: skip
    finally:
        daemon.stop()
    batches = [json.loads(r.body) for r in handlers.requests_to("/rows")]
    assert all(len({job["queue"] for job in batch}) == 1 for batch in batches)
    assert sum(map(len, batches)) == 30
    assert max(map(len, batches)) == 10
    assert [d.redis.zcard(d.keys.dead) for d in drivers] == [1, 1], "each queue's job 0 failed for good"


def test_a_workflow_over_queues_on_different_nodes_runs_in_order_and_its_batch_calls_back_once(
    redis_cluster: list[RedisServer], cluster: redis.RedisCluster, handlers: HandlerServer,
    namespace: str, tmp_path: Path,
) -> None:  # fmt: skip
    order: list[str] = []

    def record(req: Received) -> tuple[int, dict[str, str], bytes]:
        order.append(json.loads(req.body)["step"] if req.path == "/jobs/t" else "callback")
        return 200, {}, b"ok"

    url = handlers.url("/jobs/t", record)
    queues = {"a": 1, "b": 1, "c": 1}
    redis_config = {"url": redis_cluster[0].url, "cluster": True}
    handler = {"t": {"url": url}, "done": {"url": handlers.url("/jobs/done", record)}}
    config = write_config(tmp_path, "", namespace, handler, redis=redis_config, queues=queues)
    client = Client(cluster, namespace=namespace)
    # A chain a -> b -> c, then a fan-in in a of three parts in b, c and a, which form a batch whose callback
    # waits in c: every step crosses slots, and the queues spread over the masters.
    chain = client.chain([("t", {"step": f"chain{n}"}, {"queue": q}) for n, q in enumerate("abc")])
    part = {"batch": "parts", "after": chain[-1]}
    parts = client.enqueue_many([("t", {"step": f"part{n}"}, {**part, "queue": q}) for n, q in enumerate("bca")])
    client.enqueue("t", {"step": "fan-in"}, queue="a", after=parts)
    assert len({cluster.get_node_from_key(QueueDriver(cluster, namespace, q).keys.pending).name for q in "abc"}) >= 2
    daemons = [DaemonProcess(config).start() for _ in range(2)]
    try:
        # A batch's counters live in one queue: in queue b, the batch "parts" is part0.
        client.seal_batch("parts", queue="b", on_complete=("done", None, {"queue": "c"}))
        wait_for(lambda: len(order) == 8, timeout=30, what=f"every step ({daemons[0].log_tail()})")
    finally:
        for daemon in daemons:
            daemon.stop()
    assert order[:3] == ["chain0", "chain1", "chain2"]
    assert sorted(order[3:]) == ["callback", "fan-in", "part0", "part1", "part2"]
    assert order.index("fan-in") > max(order.index(p) for p in ("part0", "part1", "part2"))
    assert order.index("callback") > order.index("part0"), "the batch in queue b is part0 alone"
