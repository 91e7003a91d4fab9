"""The queue settings producers' scripts read, written to Redis by the daemons serving each queue from their
config, at start and on reload: `max_pending`, the backpressure bound of the enqueue script (ADR 0024)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from jobcar.config_types import Config
from jobcar.keys import QueueKeys
from jobcar.redis_link import RedisLink

log = logging.getLogger("jobcar.queue_settings")

#: The field of `<prefix>settings` that lua/includes/max_pending.lua reads.
MAX_PENDING_FIELD = "max_pending"
#: The field of `<prefix>settings` that counts the jobs the bound refused (HINCRBY in max_pending.lua).
REFUSED_FIELD = "refused"


def settings_commands(queues: Sequence[QueueKeys], max_pending: Mapping[str, int]) -> list[tuple[str, ...]]:
    """What makes Redis hold the config's bounds for the served queues: set where the config gives one, removed
    where it gives none (a bound taken out of the file is lifted at the reload)."""
    return [
        ("HSET", k.settings, MAX_PENDING_FIELD, str(max_pending[k.queue]))
        if k.queue in max_pending
        else ("HDEL", k.settings, MAX_PENDING_FIELD)
        for k in queues
    ]


class QueueSettings:
    """Writes the served queues' settings once after each (re)load, again after a Redis outage ends it."""

    def __init__(self, queues: Sequence[QueueKeys], link: RedisLink, config: Config) -> None:
        self.queues = list(queues)
        self.link = link
        self._unsynced = asyncio.Event()
        self.apply(config)

    def apply(self, config: Config) -> None:
        self.config = config
        self._unsynced.set()

    def add(self, keys: QueueKeys) -> None:
        """A queue served from now on (a pattern matched it, ADR 0027): its settings written at the next step."""
        self.queues.append(keys)
        self._unsynced.set()

    async def step(self) -> None:
        await self._unsynced.wait()
        config = self.config
        commands = settings_commands(self.queues, config.max_pending)

        async def send() -> None:
            pipe = self.link.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            await pipe.execute()

        await self.link.call(send)
        if self.config is config:
            self._unsynced.clear()
        for k in self.queues:
            if k.queue in config.max_pending:
                log.info("max_pending %d written", config.max_pending[k.queue], extra={"queue": k.queue})
