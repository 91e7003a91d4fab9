"""Redis Sentinel end to end, against real processes: a primary, its replica and three sentinels.

`jobcar check`, `jobcar run`, `jobcar enqueue`, the client and the Spark helper take a `redis+sentinel://`
URL, parsed once by `redis_url.parse_sentinel_url`. A failover (kill -9 of the primary, or SENTINEL
FAILOVER with the old primary still up) while a daemon runs jobs and a producer enqueues: every job
whose enqueue was acknowledged ends done, and the daemon follows the new primary without a restart.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from pyspark.sql import Row

from jobcar import Client, EnqueueStatus, JobInfo, State
from jobcar.cli import main
from jobcar.client import AsyncClient
from jobcar.keys import QueueKeys
from jobcar.spark import _PartitionWriter
from jobcar.spark_rows import Connection
from jobcar.transport import NotReplicated
from tests.integration.daemon_harness import DaemonProcess, HandlerServer, write_config
from tests.servers import SentinelGroup, wait_for

TYPE = "t.sentinel"


def config_file(tmp_path: Path, url: str, namespace: str, **redis_settings: object) -> Path:
    path = tmp_path / "jobcar.yaml"
    settings = {"url": url, **redis_settings}
    path.write_text(json.dumps({"redis": settings, "namespace": namespace, "handlers": {TYPE: {"command": ["cat"]}}}))
    return path


def stored(group: SentinelGroup, namespace: str, job_id: str) -> dict[bytes, bytes]:
    """The job's hash on the group's current primary, read without jobcar."""
    with group.current_primary().client() as c:
        fields: dict[bytes, bytes] = c.hgetall(QueueKeys.of(namespace, "default").job(job_id))  # type: ignore[assignment]
    return fields


def test_check_and_cli_enqueue_take_a_sentinel_url(
    sentinel_group: SentinelGroup, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, sentinel_group.url(), namespace)
    assert main(["check", "-c", str(config)]) == 0
    assert main(["enqueue", "-c", str(config), TYPE, '{"via": "sentinel"}', "--id", "cli-1"]) == 0
    assert "cli-1" in capsys.readouterr().out
    assert json.loads(stored(sentinel_group, namespace, "cli-1")[b"payload"]) == {"via": "sentinel"}


BAD_URLS = [
    ("redis+sentinel://:hunter2@127.0.0.1:26379,127.0.0.1:notaport/jobcar", "must be host:port"),
    ("redis+sentinel://:hunter2@127.0.0.1:26379", "no service name"),
    ("redis+sentinel://127.0.0.1:26379/jobcar?sentinel_password=hunter2&wait_replicas=-1", "wait_replicas must be"),
    ("redis+sentinel://127.0.0.1:26379/jobcar?sentinel_pasword=hunter2", "unknown option 'sentinel_pasword'"),
]


@pytest.mark.parametrize("command", ["check", "enqueue", "run"])
@pytest.mark.parametrize(("url", "message"), BAD_URLS)
def test_a_bad_sentinel_url_exits_78_naming_the_problem_and_no_password(
    command: str, url: str, message: str, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, url, namespace)
    assert main([command, "-c", str(config), *([TYPE] if command == "enqueue" else [])]) == 78
    err = capsys.readouterr().err
    assert "redis.url: invalid Redis Sentinel URL" in err
    assert message in err
    assert "hunter2" not in err
    assert "Traceback" not in err


def test_cluster_with_a_sentinel_url_exits_78(
    namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path, "redis+sentinel://127.0.0.1:26379/jobcar", namespace, cluster=True)
    assert main(["enqueue", "-c", str(config), TYPE]) == 78
    assert "cluster is true but url is a Sentinel URL" in capsys.readouterr().err


def test_the_cli_names_a_service_no_sentinel_knows_with_exit_69(
    sentinel_group: SentinelGroup, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sentinel_group.url(sentinel_password="hunter2").replace("/jobcar/0", "/nosuchservice/0")
    config = config_file(tmp_path, url, namespace)
    # The sentinels have no password: AUTH fails on each, and no primary is found.
    assert main(["enqueue", "-c", str(config), TYPE]) == 69
    err = capsys.readouterr().err
    assert "No master found for 'nosuchservice'" in err
    assert "hunter2" not in err


def test_an_enqueue_no_replica_confirms_is_not_acknowledged(
    sentinel_group: SentinelGroup, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [replica] = [s for s in sentinel_group.servers if s is not sentinel_group.current_primary()]
    assert replica.process is not None
    strict_url = sentinel_group.url(wait_timeout_ms=100)
    config = config_file(tmp_path, strict_url, namespace)

    async def enqueue_async(job_id: str) -> JobInfo:
        async with AsyncClient.from_url(strict_url, namespace=namespace) as client:
            [info] = await client.enqueue_many([(TYPE, job_id, {"job_id": job_id})])
        return info

    with Client.from_url(strict_url, namespace=namespace) as client, \
            Client.from_url(sentinel_group.url(wait_replicas=0), namespace=namespace) as lax:  # fmt: skip
        replica.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(NotReplicated, match="0 of the 1 replicas asked for confirmed it within 100 ms"):
                client.enqueue(TYPE, 1, job_id="sync-1")
            with pytest.raises(NotReplicated):
                asyncio.run(enqueue_async("async-1"))
            assert main(["enqueue", "-c", str(config), TYPE, "--id", "cli-1"]) == 1
            assert "NotReplicated: the primary stored the write but 0 of the 1 replicas" in capsys.readouterr().err
            assert lax.enqueue(TYPE, 3, job_id="lax-1").status is EnqueueStatus.CREATED  # no WAIT asked for
        finally:
            replica.process.send_signal(signal.SIGCONT)
        # The primary holds the first attempts: sent again, each is found (add-if-absent), confirmed this time.
        assert client.enqueue(TYPE, 1, job_id="sync-1").status is EnqueueStatus.EXISTS
        assert asyncio.run(enqueue_async("async-1")).status is EnqueueStatus.EXISTS
        assert main(["enqueue", "-c", str(config), TYPE, "--id", "cli-1"]) == 0


def test_enqueues_sharing_round_trips_are_each_confirmed_by_the_replicas(
    sentinel_group: SentinelGroup, namespace: str
) -> None:
    """The HTTP API's client (shared round trips): each concurrent enqueue carries its own WAIT, and is answered
    only once a replica holds it, or raises NotReplicated when none confirms."""
    [replica] = [s for s in sentinel_group.servers if s is not sentinel_group.current_primary()]
    assert replica.process is not None
    url = sentinel_group.url(wait_timeout_ms=100)

    async def enqueue_all(prefix: str) -> list[JobInfo | BaseException]:
        async with AsyncClient.from_url(url, namespace=namespace, shared_round_trips=True) as client:
            calls = [client.enqueue(TYPE, n, job_id=f"{prefix}-{n}") for n in range(20)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            assert client.round_trips is not None
            assert client.round_trips.sent < 20
            return results

    assert all(isinstance(r, JobInfo) and r.created for r in asyncio.run(enqueue_all("confirmed")))
    replica.process.send_signal(signal.SIGSTOP)
    try:
        assert all(isinstance(r, NotReplicated) for r in asyncio.run(enqueue_all("unconfirmed")))
    finally:
        replica.process.send_signal(signal.SIGCONT)


def test_the_spark_helpers_partition_writer_enqueues_through_sentinel(
    sentinel_group: SentinelGroup, namespace: str
) -> None:
    writer = _PartitionWriter(
        type=TYPE,
        job_id="order_id",
        payload=None,
        options={"queue": "default", "batch": "b-sentinel"},
        connection=Connection(sentinel_group.url(), namespace),
        batch_size=2,
    )
    writer(Row(order_id=f"order-{n}", amount=n) for n in range(5))
    for n in range(5):
        assert json.loads(stored(sentinel_group, namespace, f"order-{n}")[b"payload"]) == {
            "order_id": f"order-{n}",
            "amount": n,
        }
    with Client.from_url(sentinel_group.url(), namespace=namespace) as client:
        assert client.batch_status("b-sentinel").total == 5


class Producer(threading.Thread):
    """Enqueues jobs job-0, job-1, ... one at a time, each sent again until it is acknowledged, as a producer
    that must not lose a job does; keeps the acknowledged ids."""

    def __init__(self, url: str, namespace: str) -> None:
        super().__init__(daemon=True)
        self.url, self.namespace = url, namespace
        self.acknowledged: list[str] = []
        self.refusals: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with Client.from_url(self.url, namespace=self.namespace, socket_timeout=5) as client:
            n = 0
            while not self.stop.is_set():
                job_id = f"job-{n}"
                try:
                    client.enqueue(TYPE, n, job_id=job_id)
                except (redis.RedisError, OSError) as exc:
                    name = type(exc).__name__
                    self.refusals[name] = self.refusals.get(name, 0) + 1
                    time.sleep(0.02)
                    continue
                self.acknowledged.append(job_id)
                n += 1

    def wait_for_more(self, count: int, timeout: float = 30) -> None:
        target = len(self.acknowledged) + count
        wait_for(lambda: len(self.acknowledged) >= target, timeout=timeout, what=f"{count} more acknowledged enqueues")


def test_failovers_while_jobs_flow_lose_no_acknowledged_enqueue_and_the_daemon_follows(
    failover_group: SentinelGroup, handlers: HandlerServer, namespace: str, tmp_path: Path
) -> None:
    group = failover_group
    url = handlers.url("/jobs", lambda req: (200, {}, b"ok"))
    config = write_config(tmp_path, group.url(), namespace, {TYPE: {"url": url}}, lease="2s", result_ttl="1h")
    daemon = DaemonProcess(config).start()
    producer = Producer(group.url(), namespace)
    producer.start()
    try:
        producer.wait_for_more(100)
        first = group.current_primary()
        first.kill()  # a crash: whatever it did not replicate is gone
        second = group.wait_for_failover(first)
        # With its only replica promoted, the new primary has none to confirm enqueues until one is back.
        group.restart_as_replica(first, second)
        producer.wait_for_more(100)
        wait_for(group.ready, what="the sentinels to see the restarted server as the replica, in sync")
        # A planned failover: the old primary stays up, and is demoted only once the sentinels see the switch.
        with group.sentinels[0].client() as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", "jobcar")
        group.wait_for_failover(second)
        producer.wait_for_more(100)
    finally:
        producer.stop.set()
        producer.join(timeout=10)
    with Client.from_url(group.url(), namespace=namespace) as client:
        for job_id in producer.acknowledged:
            job = client.wait(job_id, timeout=30)
            assert job is not None, f"acknowledged {job_id} is gone\n{daemon.log_tail()}"
            assert job.state is State.DONE, job
    seen = {r.headers["jobcar-job-id"] for r in handlers.requests_to("/jobs")}
    assert set(producer.acknowledged) <= seen
    assert daemon.process is not None
    assert daemon.process.poll() is None, daemon.log_tail()
    messages = [line.get("msg", "") for line in daemon.lines()]
    assert "redis reachable again" in messages
    assert sum(m.startswith("jobcar running") for m in messages) == 1  # the same run throughout
    print(f"{len(producer.acknowledged)} acknowledged, refusals on the way {producer.refusals}")
    daemon.stop()
    assert daemon.process.returncode == 0
