"""The daemons of a namespace as each announces itself every ANNOUNCE_INTERVAL in `<namespace>:daemons`:
who runs (host, pid, version, queues, concurrency, jobs in flight, since when), for the dashboard.

An entry carries the Redis times of its first announce and of its last renewal; one not renewed for LIVE_FOR
is a daemon gone without saying so (`kill -9`, a lost host) and is not shown. A daemon's sweep (its first
announce, then one every SWEEP_INTERVAL: the `announce` script) reads every entry, deletes those silent for
FORGET_AFTER and answers its own first announce's time and Redis's time now. Every announce is then one HSET
of the daemon's whole entry, written here only: its time is the last sweep's Redis time moved on by the
daemon's monotonic clock, at most a minute's worth (ADR 0022). A daemon that stops cleanly withdraws its entry
(HDEL).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from redis import exceptions as redis_errors

from jobcar import __version__
from jobcar.config_types import Config
from jobcar.keys import daemons_key
from jobcar.redis_link import RedisLink, naming_key
from jobcar.replies import as_int, as_list, time_ms
from jobcar.scripts import call
from jobcar.transport import AsyncRedis

#: How often a daemon renews its entry (seconds).
ANNOUNCE_INTERVAL: Final = 5.0
#: An entry not renewed for this long (ms) is a daemon gone.
LIVE_FOR_MS: Final = 3 * int(ANNOUNCE_INTERVAL * 1000)
#: An entry not renewed for this long (ms) is deleted.
FORGET_AFTER_MS: Final = 3_600_000
#: An announce sweeps (reads every entry, deleting the forgotten ones, and Redis's time) when the last sweep is
#: this old (seconds): an entry is forgotten an hour after its daemon went, so reading them all every 5 s bought
#: nothing, and a renewal's time is never moved on from an older one (ADR 0022).
SWEEP_INTERVAL: Final = 60.0


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    id: str
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]
    concurrency: int
    in_flight: int
    started_ms: int
    seen_ms: int


class Announcer:
    """Keeps this daemon's entry: `step` is the loop's step, `withdraw` the last word of a clean stop."""

    def __init__(
        self,
        link: RedisLink,
        config: Config,
        in_flight: Callable[[], int],
        found: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.link = link  # the daemon's: its guard, backoff and outage handling
        self.config = config  # replaced on reload: the queues and concurrency announced follow it
        self.in_flight = in_flight
        self.found = found  # the queues served because a pattern matched them (ADR 0027), after the config's
        self.host = socket.gethostname()
        self.id = f"{self.host}:{os.getpid()}:{secrets.token_hex(3)}"
        self._started_ms: int | None = None  # the Redis time of the first announce, once a sweep gave it
        #: How old the last sweep may be before an announce sweeps again (tests shorten it).
        self.sweep_interval = SWEEP_INTERVAL
        # The last sweep's Redis time (ms) and this process's monotonic time when its reply came.
        self._swept = (0, 0.0)

    def apply(self, config: Config) -> None:
        self.config = config

    async def step(self) -> None:
        await self.announce()
        await asyncio.sleep(ANNOUNCE_INTERVAL)

    async def announce(self) -> None:
        if self._started_ms is None or time.monotonic() - self._swept[1] >= self.sweep_interval:
            await self._sweep()
        swept_ms, swept_at = self._swept
        entry = {
            "host": self.host, "pid": os.getpid(), "version": __version__,
            "queues": [*self.config.queues, *self.found()],
            "concurrency": self.config.concurrency, "in_flight": self.in_flight(),
            "started_ms": self._started_ms, "seen_ms": swept_ms + int((time.monotonic() - swept_at) * 1000),
        }  # fmt: skip
        await self.link.call(functools.partial(self._write, "HSET", json.dumps(entry, separators=(",", ":"))))

    async def withdraw(self) -> None:
        await self.link.call(functools.partial(self._write, "HDEL"))

    async def _sweep(self) -> None:
        """Forget the entries silent for FORGET_AFTER_MS; learn this daemon's first announce's time (its own entry's,
        or now for the first) and Redis's time now."""
        key = daemons_key(self.config.namespace)
        (reply,) = await self.link.scripts([call("announce", (key,), (self.id, FORGET_AFTER_MS))])
        _, started_ms, now_ms = as_list(reply)
        self._started_ms = as_int(started_ms)
        self._swept = (as_int(now_ms), time.monotonic())

    async def _write(self, command: str, *entry: str) -> None:
        """This daemon's entry written whole (HSET) or withdrawn (HDEL). A key of another type is refused naming
        it, as the script's refusals do."""
        key = daemons_key(self.config.namespace)
        try:
            await self.link.client.execute_command(command, key, self.id, *entry)
        except redis_errors.ResponseError as exc:
            raise naming_key(exc, key, "hash") from None


async def live_daemons(redis: AsyncRedis, namespace: str) -> list[DaemonInfo]:
    """The daemons that announced themselves within LIVE_FOR_MS (Redis time), by host and pid; none when the key
    holds another type (written by hand: the daemons' announces are refused too, and say so in their logs)."""
    try:
        entries = await redis.hgetall(daemons_key(namespace))
    except redis_errors.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        return []
    now_ms = time_ms(await redis.time())
    daemons = []
    for daemon_id, text in entries.items():
        try:
            entry = json.loads(text)
            info = DaemonInfo(
                id=daemon_id.decode("utf-8", "replace") if isinstance(daemon_id, bytes) else str(daemon_id),
                host=str(entry["host"]), pid=int(entry["pid"]), version=str(entry["version"]),
                queues=tuple(str(q) for q in entry["queues"]), concurrency=int(entry["concurrency"]),
                in_flight=int(entry["in_flight"]), started_ms=int(entry["started_ms"]), seen_ms=int(entry["seen_ms"]),
            )  # fmt: skip
        except (ValueError, TypeError, KeyError):
            continue  # not a daemon's entry: the forget time removes it
        if info.seen_ms >= now_ms - LIVE_FOR_MS:
            daemons.append(info)
    return sorted(daemons, key=lambda d: (d.host, d.pid))
