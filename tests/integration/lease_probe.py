"""Seeing a lease queued behind an idle wait (ADR 0005) on Redis and on Valkey alike.

Redis keeps the bytes a client sent behind a blocked command in that client's query buffer, which
`CLIENT LIST` shows as `qbuf`; Valkey 8 and later parse them ahead into a queue of commands that
`CLIENT LIST` does not show (`qbuf` stays 0, though `tot-net-in` counts the bytes). What both servers
show is the lease when it runs: MONITOR prints every command as it runs, and only a lease queued behind a
wait names the daemon's alive key, as its sixth key. So this probe watches the leases run: the lease that
took a job right after its enqueue either was queued behind the wait (six keys) or was sent after the wake
(five).
"""

from __future__ import annotations

import re
import socket
import threading
from types import TracebackType

import redis

from tests.servers import RedisServer, wait_for

# A monitor line: +<time> [<db> <client>] "EVALSHA" "<sha>" "<numkeys>" "<key 1>" ... (then the arguments).
_SCRIPT_CALL = re.compile(rb'"EVALSHA" "[0-9a-f]+" "(\d+)" "([^"]*)"(.*)$')


def queued_behind_waits(client: redis.Redis) -> list[int]:
    """For each connection waiting in BLMOVE, the bytes of commands it sent behind the wait as the server
    shows them (`qbuf`): a lease, on a one-queue daemon, on Redis; always 0 on Valkey (see above)."""
    return [int(c["qbuf"]) for c in client.client_list() if c.get("cmd") == "blmove"]


def wait_for_a_queued_lease(client: redis.Redis, monitor: LeaseMonitor) -> None:
    """Until a lease waits behind an idle BLMOVE: seen in the query buffer (Redis), or, where the server hides
    it, once one has run (an idle wait ends every 5 s and its lease is queued again at once, so the next
    one is waiting within milliseconds). Either way `taken_by_a_queued_lease` confirms it after the enqueue."""
    ran = monitor.leases().count(True)
    # Up to two idle waits of 5 s: the first may have begun before the heartbeat's alive key existed.
    wait_for(lambda: any(queued_behind_waits(client)) or monitor.leases().count(True) > ran, timeout=30,
             what="a lease queued behind the idle wait")  # fmt: skip


class LeaseMonitor:
    """MONITOR on a connection of its own, in a thread, keeping every script call in order."""

    def __init__(self, server: RedisServer) -> None:
        self._socket = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._calls: list[tuple[int, bytes, bytes]] = []  # (numkeys, first key, the rest of the line)
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> LeaseMonitor:
        self._socket.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self._socket.settimeout(0.2)
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()

    def leases(self) -> list[bool]:
        """Every lease run so far, in order: True for one that was queued behind an idle wait."""
        with self._lock:
            return [keys == 6 for keys, first, _ in self._calls if keys in (5, 6) and first.endswith(b":pending")]

    def taken_by_a_queued_lease(self, job_id: str) -> bool | None:
        """Whether the first lease that ran after the job's enqueue was queued behind a wait; None while no
        lease has run since (or the enqueue was not seen)."""
        with self._lock:
            calls = list(self._calls)
        marker = f'"{job_id}"'.encode()
        enqueued = next((i for i, (keys, _, rest) in enumerate(calls) if keys == 3 and marker in rest), None)
        if enqueued is None:
            return None
        for keys, first, _ in calls[enqueued + 1 :]:
            if keys in (5, 6) and first.endswith(b":pending"):
                return keys == 6
        return None

    def queued_lease_took(self, job_id: str) -> bool:
        """`taken_by_a_queued_lease` once MONITOR's stream has shown the lease that took the job: the monitor
        reads in a thread of its own, so it may see the job's lease after the job is already done."""
        wait_for(lambda: self.taken_by_a_queued_lease(job_id) is not None, what=f"the lease that took {job_id}")
        return self.taken_by_a_queued_lease(job_id) is True

    def _read(self) -> None:
        pending = b""
        while not self._stop.is_set():
            try:
                chunk = self._socket.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            lines = (pending + chunk).split(b"\r\n")
            pending = lines.pop()
            calls = [(int(m[1]), m[2], m[3]) for line in lines if (m := _SCRIPT_CALL.search(line))]
            if calls:
                with self._lock:
                    self._calls += calls
