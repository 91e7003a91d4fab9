"""Session-wide fixtures: one real server per test session (per xdist worker), a namespace per test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import redis
import uvloop

from tests.integration.daemon_harness import DaemonProcess
from tests.servers import RedisServer, SentinelGroup, find_server_binary, start_cluster

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

#: The loops an async test can ask for by name; the daemon runs on uvloop where it is installed.
LOOP_FACTORIES: dict[str, LoopFactory] = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, LoopFactory]:
    """Where pytest-asyncio runs an async test: on a fresh asyncio loop, or once on each loop its marker
    names, as `@pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])` does (ids `[asyncio]`, `[uvloop]`)."""
    marker = item.get_closest_marker("asyncio")
    if marker is not None and "loop_factories" in marker.kwargs:
        return LOOP_FACTORIES
    return {"asyncio": asyncio.new_event_loop}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Soak tests first: xdist hands them out first, so a minutes-long test runs beside the rest of the suite
    instead of after it. The Spark tests are `one_server` (Spark's side is the same on every server): marked
    here, not by a `pytestmark` of their modules, which Spark pickles by value to its executors."""
    for item in items:
        if item.path.name.startswith("test_spark"):
            item.add_marker(pytest.mark.one_server)
    items.sort(key=lambda item: item.get_closest_marker("soak") is None)


@pytest.fixture(autouse=True)
def no_daemon_outlives_its_test() -> Iterator[None]:
    yield
    DaemonProcess.stop_leftovers()


@pytest.fixture(scope="session")
def server_binary() -> str:
    return find_server_binary()


@pytest.fixture(scope="session")
def redis_server(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(server_binary, tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    nodes = start_cluster(server_binary, Path(tmp_path_factory.mktemp("cluster")))
    yield nodes
    for node in nodes:
        node.stop()


@pytest.fixture(scope="session")
def sentinel_group(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A primary, its replica and three sentinels, shared by the session. Tests that fail it over take
    `failover_group`; one that pauses a server of it resumes it before it ends."""
    group = SentinelGroup.start(server_binary, tmp_path_factory.mktemp("sentinel"))
    yield group
    group.stop()


@pytest.fixture
def failover_group(server_binary: str, tmp_path: Path) -> Iterator[SentinelGroup]:
    """A Sentinel group of the test's own, to fail over."""
    group = SentinelGroup.start(server_binary, tmp_path / "sentinel")
    yield group
    group.stop()


@pytest.fixture
def namespace() -> str:
    """Tests share a server; each works in its own namespace, so they can run in parallel."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis_server.client() as client:
        yield client


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def any_redis(request: pytest.FixtureRequest) -> Iterator[redis.Redis | redis.RedisCluster]:
    """The same test against a standalone server and against the 3-master Cluster."""
    client: redis.Redis | redis.RedisCluster
    if request.param == "standalone":
        client = request.getfixturevalue("redis_server").client()
    else:
        nodes: list[RedisServer] = request.getfixturevalue("redis_cluster")
        client = redis.RedisCluster(host="127.0.0.1", port=nodes[0].port)
    yield client
    client.close()
