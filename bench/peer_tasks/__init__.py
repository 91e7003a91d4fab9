"""The job each peer runs, in the modules its worker imports (bench/peers.py puts bench/ on their path).

Every peer runs the same in-process no-op whose only act is to say when it started: one datagram on a
Unix socket (`PEERS_SOCKET`) carrying the payload's enqueue timestamp and the job's start time, both
wall clock. A datagram costs one syscall and needs no Redis round trip, so it does not load the server
under test; a full AF_UNIX datagram queue blocks the sender instead of dropping, so none is lost.
"""

from __future__ import annotations

import os
import socket
import time

REDIS_URL = os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379/0")
SOCKET_PATH = os.environ.get("PEERS_SOCKET", "")

_sockets: dict[int, socket.socket] = {}


def started(payload: dict[str, object]) -> None:
    """The whole job body: report (enqueued at, started at) to the harness."""
    at = time.time()
    # One socket per process: prefork pools (Celery, huey, RQ's work horse) fork after import.
    sock = _sockets.get(os.getpid())
    if sock is None:
        sock = _sockets[os.getpid()] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.sendto(f"{payload['ts']!r} {at!r}".encode(), SOCKET_PATH)
