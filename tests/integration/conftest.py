"""Fixtures shared by integration tests: daemons on the session's server, a queue driver, and the CLI
tests' config file and producer."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobcar import Client
from tests.integration.daemon_harness import DaemonProcess, HandlerServer, handler_server
from tests.integration.daemon_harness import write_config as write_daemon_config
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import write_config
from tests.servers import RedisServer


@pytest.fixture
def config(tmp_path: Path, redis_server: RedisServer, namespace: str) -> Path:
    return write_config(
        tmp_path / "jobcar.yaml",
        f"""\
        redis: {{url: "{redis_server.url}"}}
        namespace: {namespace}
        queues: {{default: 1, low: 1}}
        handlers:
          t.echo:
            command: [cat]
        """,
    )


@pytest.fixture
def client(redis_server: RedisServer, namespace: str) -> Iterator[Client]:
    with Client.from_url(redis_server.url, namespace=namespace) as c:
        yield c


StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def start_daemon(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[StartDaemon]:
    """Start `jobcar run` on a config for the session's server; every daemon is stopped afterwards."""
    started: list[DaemonProcess] = []

    def start(handlers: dict[str, Any], **top: Any) -> DaemonProcess:
        daemon = DaemonProcess(write_daemon_config(tmp_path, redis_server.url, namespace, handlers, **top)).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def q(r: redis.Redis, namespace: str) -> QueueDriver:
    return QueueDriver(r, namespace)


@pytest.fixture
def pids_file(tmp_path: Path) -> Iterator[Path]:
    """Where command handlers publish their pids; whatever is listed (and its group) is killed after the
    test, pass or fail."""
    path = tmp_path / "pids"
    yield path
    if path.exists():
        for pid in path.read_text().split():
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(int(pid), signal.SIGKILL)


@pytest.fixture
def handlers() -> Iterator[HandlerServer]:
    """A real HTTP handler on loopback (daemon_harness.HandlerServer) for the test's daemons to call."""
    with handler_server() as server:
        yield server
