"""Dynamic queues (ADR 0027): the queues producers register in `<namespace>:queues` that a pattern of the
config (`queues: {"tenant-*": 1}`) matches and no literal name does, found while the daemon runs and handed
to the runner, which serves them from then on.

Without a pattern the loop sends nothing at all. With patterns, each DISCOVER_INTERVAL it asks the set's
size (one `SCARD`), and reads the names (`SMEMBERS`) only when the size changed, at start, after a reload
and each FULL_READ_INTERVAL (a name removed and another added leave the size as it was).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from jobcar.config_types import Config
from jobcar.keys import queues_key
from jobcar.names import NAME_PATTERN, pattern_weight
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.replies import decode_names

log = logging.getLogger("jobcar.queue_discovery")

#: How often a daemon with queue patterns asks whether `<namespace>:queues` grew: the longest a queue's
#: first jobs wait for a daemon to serve it (one SCARD per this many seconds and daemon).
DISCOVER_INTERVAL: Final = 2.0
#: How often the names are read even though the set's size did not change.
FULL_READ_INTERVAL: Final = 60.0


class QueueDiscovery:
    """Finds the queues the config's patterns match; `serve(name, weight)` is called for each new one, and
    for each one found before whose weight a reload changed."""

    def __init__(self, link: RedisLink, config: Config, serve: Callable[[str, int], None]) -> None:
        self.link = link
        self.serve = serve
        #: Queue -> weight, of the queues a pattern matched (kept until the daemon stops: a reload that
        #: removes the pattern does not stop serving them).
        self.found: dict[str, int] = {}
        self._enabled = asyncio.Event()
        self._poked = asyncio.Event()
        self._size: int | None = None
        self._read_at = 0.0
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Take a (re)loaded config's patterns: read the names again at once, and give the queues found
        before the weight of the pattern that matches them now."""
        self.config = config
        self._size = None  # the next pass reads the names
        if not config.queue_patterns:
            self._enabled.clear()
            return
        for queue, weight in self.found.items():
            now = pattern_weight(queue, config.queue_patterns)
            if now is not None and now != weight:
                self.found[queue] = now
                self.serve(queue, now)
        self._enabled.set()
        self._poked.set()

    async def step(self) -> None:
        """One look, after DISCOVER_INTERVAL or a reload; nothing while the config has no pattern."""
        await self._enabled.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DISCOVER_INTERVAL):
                await self._poked.wait()
        self._poked.clear()
        if not self.config.queue_patterns:
            return
        await self.look()

    async def look(self) -> list[str]:
        """Read `<namespace>:queues` if it may hold new names, and serve the new matches; the queues added."""
        client, key = self.link.client, queues_key(self.config.namespace)
        try:
            if self._size is not None and time.monotonic() < self._read_at + FULL_READ_INTERVAL:
                size: int = await self.link.call(lambda: client.scard(key))
                if size == self._size:
                    return []
            names = decode_names(await self.link.call(lambda: client.smembers(key)))
        except RedisUnavailable:
            self._poked.set()  # again as soon as the link's backoff lets it
            raise
        self._size, self._read_at = len(names), time.monotonic()
        added = []
        patterns, literals = self.config.queue_patterns, self.config.queues
        for queue in names:
            if queue in literals or queue in self.found or not NAME_PATTERN.fullmatch(queue):
                continue
            weight = pattern_weight(queue, patterns)
            if weight is not None:
                self.found[queue] = weight
                added.append(queue)
                self.serve(queue, weight)
        return added
