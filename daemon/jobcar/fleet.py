"""The daemons of a namespace as each announces itself every ANNOUNCE_INTERVAL in `<namespace>:daemons`:
who runs (host, pid, version, queues, concurrency, jobs in flight, since when), for the dashboard.

An entry carries the Redis times of its first announce and of its last renewal; one not renewed for LIVE_FOR
is a daemon gone without saying so (`kill -9`, a lost host) and is not shown. A daemon's sweep (its first
announce, then one every SWEEP_EVERY: the `announce` script) reads every entry, deletes those silent for
FORGET_AFTER and answers the Redis time. The renewals between sweeps are one HSET of the daemon's own entry:
its time is the last sweep's Redis time moved on by the daemon's monotonic clock, at most a minute's worth
(ADR 0022). A daemon that stops cleanly withdraws its entry.
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
from jobcar.replies import time_ms
from jobcar.scripts import call
from jobcar.transport import AsyncRedis

#: How often a daemon renews its entry (seconds).
ANNOUNCE_INTERVAL: Final = 5.0
#: An entry not renewed for this long (ms) is a daemon gone.
LIVE_FOR_MS: Final = 3 * int(ANNOUNCE_INTERVAL * 1000)
#: An entry not renewed for this long (ms) is deleted.
FORGET_AFTER_MS: Final = 3_600_000
#: Every this many announces, one reads every entry to delete the forgotten ones (once a minute): an entry
#: is forgotten an hour after its daemon went, so reading them all every 5 s bought nothing (ADR 0022).
SWEEP_EVERY: Final = 12


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
        # The last sweep's Redis time (ms) and this process's monotonic time when its reply came.
        self._swept = (0, 0.0)
        self._announces = 0

    def apply(self, config: Config) -> None:
        self.config = config

    async def step(self) -> None:
        await self.announce()
        await asyncio.sleep(ANNOUNCE_INTERVAL)

    async def announce(self) -> None:
        entry = {
            "host": self.host, "pid": os.getpid(), "version": __version__,
            "queues": [*self.config.queues, *self.found()],
            "concurrency": self.config.concurrency, "in_flight": self.in_flight(),
        }  # fmt: skip
        # Counted once sent: a sweep that failed is the next announce too, so no renewal's time is moved on from
        # a sweep older than SWEEP_EVERY announces.
        if self._started_ms is None or self._announces % SWEEP_EVERY == 0:
            await self._sweep(json.dumps(entry, separators=(",", ":")))
        else:
            swept_ms, swept_at = self._swept
            entry["started_ms"] = self._started_ms
            entry["seen_ms"] = swept_ms + int((time.monotonic() - swept_at) * 1000)
            await self.link.call(functools.partial(self._write, json.dumps(entry, separators=(",", ":"))))
        self._announces += 1

    async def withdraw(self) -> None:
        await self._sweep("")

    async def _sweep(self, entry: str) -> None:
        key = daemons_key(self.config.namespace)
        (reply,) = await self.link.scripts([call("announce", (key,), (self.id, entry, FORGET_AFTER_MS))])
        if isinstance(reply, list) and len(reply) == 3 and entry:
            self._started_ms = int(reply[1])
            self._swept = (int(reply[2]), time.monotonic())

    async def _write(self, entry: str) -> None:
        """A renewal: the entry written whole, with its times. A key of another type is refused naming it, as
        the script's refusals do."""
        key = daemons_key(self.config.namespace)
        try:
            await self.link.client.hset(key, self.id, entry)
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
