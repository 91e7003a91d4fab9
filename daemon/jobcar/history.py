"""Fleet-wide counts of finished attempts, per queue, job type and 10 s of Redis time, kept in Redis for
two to three hours: what `jobcar stats` shows for the last minute and hour, from every daemon at once.

Each daemon counts in memory (a dict increment per finished attempt) and adds its counts to Redis every
FLUSH_INTERVAL, one `count` script call per queue, so the per-job cost stays off the hot path. Counts a
flush could not write (Redis away or out of memory) are kept for the next one.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Final

from jobcar.config_types import Config
from jobcar.history_calls import count_call
from jobcar.keys import QueueKeys
from jobcar.recording import Recorded
from jobcar.redis_link import RedisLink

#: How often a daemon adds its counts to Redis (seconds).
FLUSH_INTERVAL: Final = 5.0
#: The history's outcomes for what recording made of a job; others (returned, canceled, a lost lease) are
#: not an attempt's end and are not counted.
_COUNTED: Final = {
    Recorded.DONE: ("done",),
    Recorded.RETRIED: ("failed",),
    Recorded.DEAD: ("failed", "dead"),
}


class History:
    def __init__(self, namespace: str, link: RedisLink, queues: list[str]) -> None:
        self.namespace = namespace
        self.link = link
        self.queues = queues  # the daemon's: one of them carries the flush sent with nothing to count
        self._counts: dict[str, Counter[tuple[str, str]]] = {}
        #: The config's `history`: off, nothing is counted (and so nothing flushed).
        self.enabled = True

    def apply(self, config: Config) -> None:
        self.enabled = config.history

    def add(self, queue: str, job_type: str, recorded: Recorded) -> None:
        outcomes = _COUNTED.get(recorded)
        if outcomes and self.enabled:
            counts = self._counts.get(queue)
            if counts is None:
                counts = self._counts[queue] = Counter()
            for outcome in outcomes:
                key = (job_type, outcome)
                counts[key] = counts.get(key, 0) + 1  # Counter's own += calls __missing__ for a new key

    async def step(self) -> None:
        """The flush loop's step: wait FLUSH_INTERVAL, then flush."""
        await asyncio.sleep(FLUSH_INTERVAL)
        await self.flush()

    async def flush(self) -> None:
        """Add the counts so far to Redis; on failure they stay for the next flush (RedisUnavailable).

        The count script is refused while Redis is out of memory, so a flush is how the daemon learns that
        Redis has memory again: while the link says it is out of memory, a flush is sent even with nothing
        to count (it writes nothing then)."""
        reachability = self.link.reachability
        if not self._counts and not (reachability.out_of_memory and self.queues):
            return
        taken, self._counts = self._counts, {}
        calls = [count_call(QueueKeys.of(self.namespace, queue), counts) for queue, counts in taken.items()]
        if not calls:
            calls = [count_call(QueueKeys.of(self.namespace, self.queues[0]), {})]
        try:
            await self.link.scripts(calls)
        except BaseException:
            for queue, counts in taken.items():  # counted again at the next flush, never lost here
                self._counts.setdefault(queue, Counter()).update(counts)
            raise
        reachability.writes_accepted()
