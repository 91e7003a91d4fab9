"""The queue settings producers' scripts read, written to Redis by the daemons serving each queue from their
config, at start and on reload: the backpressure bounds of the enqueue script (ADR 0024), the queue's
`max_pending` and each type's `max_pending:<type>`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from typing import Final

from jobcar.config_types import Config
from jobcar.keys import QueueKeys
from jobcar.redis_link import RedisLink

log = logging.getLogger("jobcar.queue_settings")

#: The field of `<prefix>settings` that lua/includes/max_pending.lua reads.
MAX_PENDING_FIELD: Final = "max_pending"
#: The field of `<prefix>settings` that counts the jobs the bound refused (HINCRBY in max_pending.lua).
REFUSED_FIELD: Final = "refused"
#: What every field of a type's bound starts with; the type's name follows (`type_bound_field`).
TYPE_BOUND_PREFIX: Final = f"{MAX_PENDING_FIELD}:"


def type_bound_field(job_type: str) -> str:
    """The field of `<prefix>settings` that holds `handlers.<job_type>.max_pending`, read by the enqueue
    script (includes/max_pending.lua) and by stats.lua."""
    return TYPE_BOUND_PREFIX + job_type


def is_bound_field(name: str) -> bool:
    """Whether a field of `<prefix>settings` is one of the bounds the daemons write (and so lift)."""
    return name == MAX_PENDING_FIELD or name.startswith(TYPE_BOUND_PREFIX)


def configured_bounds(config: Config, queue: str) -> dict[str, int]:
    """The bound fields `config` gives `queue`, field -> bound. The types' bounds go to the literal queues of
    `queues` only, as `max_pending` does (a pattern may match any number of queues producers make)."""
    bounds = {MAX_PENDING_FIELD: config.max_pending[queue]} if queue in config.max_pending else {}
    if queue in config.queues:
        for job_type, handler in config.handlers.items():
            if handler.max_pending is not None:
                bounds[type_bound_field(job_type)] = handler.max_pending
    return bounds


def settings_commands(
    queues: Sequence[QueueKeys], config: Config, lifted_types: Collection[str] = ()
) -> list[tuple[str, ...]]:
    """What makes Redis hold the config's bounds for the served queues: set where the config gives one, deleted
    where it gives none (a bound taken out of the file is lifted at the reload). A daemon owns the queue's bound
    and, on the literal queues of `queues`, the bounds of the types it runs and of `lifted_types` (those it wrote
    before and runs no more): a fleet whose daemons run different types of one queue keeps each type's bound.
    `refused` is every producer's count, not the config's: never deleted."""
    commands: list[tuple[str, ...]] = []
    for k in queues:
        bounds = configured_bounds(config, k.queue)
        owned = [MAX_PENDING_FIELD]
        if k.queue in config.queues:
            owned += [type_bound_field(t) for t in sorted({*config.handlers, *lifted_types})]
        if bounds:
            commands.append(("HSET", k.settings, *(x for item in bounds.items() for x in (item[0], str(item[1])))))
        lifted = [name for name in owned if name not in bounds]
        if lifted:
            commands.append(("HDEL", k.settings, *lifted))
    return commands


class QueueSettings:
    """Writes the served queues' settings once after each (re)load, again after a Redis outage ends it."""

    def __init__(self, queues: Sequence[QueueKeys], link: RedisLink, config: Config) -> None:
        self.queues = list(queues)
        self.link = link
        self._unsynced = asyncio.Event()
        #: The types whose bounds this daemon wrote at its last step: lifted when a reload drops their handler.
        self._written_types: set[str] = set()
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
        # Cleared before the calls, set again if they fail: a reload or a queue added while they run is
        # written at the next step, not lost with this one.
        self._unsynced.clear()
        config, queues = self.config, list(self.queues)
        commands = settings_commands(queues, config, self._written_types - set(config.handlers))
        try:
            await self.link.call(lambda: self._write(commands))
        except BaseException:
            self._unsynced.set()
            raise
        self._written_types = {t for t, handler in config.handlers.items() if handler.max_pending is not None}
        for k in queues:
            for name, bound in configured_bounds(config, k.queue).items():
                log.info("%s %d written", name, bound, extra={"queue": k.queue})

    async def _write(self, commands: Sequence[tuple[str, ...]]) -> None:
        pipe = self.link.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        await pipe.execute()
