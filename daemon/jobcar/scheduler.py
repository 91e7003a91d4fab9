"""Periodic jobs: fire the due ticks of the schedules of the queues this daemon serves.

Every daemon of the fleet does this, with no leader: each step is a compare-and-set in `schedule_fire`, so
a tick another daemon fired already is found moved and skipped here (ADR 0012). A round reads each queue's
due schedules in Redis time, plans their steps by their catch-up policy (`schedules.plan`), fires them, and
sleeps until the earliest next tick, at most MAX_SLEEP (so a schedule created or changed elsewhere is seen).
All the steps of a round are sent in one round trip. A queue found without schedules is then looked at by
one EXISTS shared with the other such queues, not by its script, until a schedule appears (ADR 0022).
"""

from __future__ import annotations

import logging
from typing import Final

from jobcar import schedule_store, tracing
from jobcar.config_types import Config
from jobcar.keys import QueueKeys
from jobcar.loops import any_exists
from jobcar.metrics import Metrics
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.schedules import ScheduleSpec, Step, due_call, fire_call, parse_due, parse_fire, plan
from jobcar.scripts import Reply
from jobcar.transport import run_async

log = logging.getLogger("jobcar.scheduler")

#: The longest sleep between two rounds: how soon a schedule created or changed elsewhere is seen when no
#: tick of the queue's schedules comes sooner (one read per queue with schedules and round, and one EXISTS
#: for the queues without: an idle daemon's cost).
MAX_SLEEP: Final = 5.0
#: Slept past the earliest tick, which is due once Redis time reaches it.
TICK_MARGIN: Final = 0.002


class Scheduler:
    def __init__(self, queues: list[QueueKeys], link: RedisLink, metrics: Metrics, config: Config) -> None:
        self.queues = queues
        self.link = link
        self.metrics = metrics
        self.apply(config)
        self._sleep = 0.0
        #: The schedule hashes of another type seen due, by (queue, name): logged once each, and a config
        #: schedule among them is written again once the key no longer shows there (fsck deleted it).
        self._broken: set[tuple[str, str]] = set()
        #: The queues whose schedule ZSET held nothing at the last read: looked at by one EXISTS per round.
        self._without: set[str] = set()

    def apply(self, config: Config) -> None:
        """Take a (re)loaded config: its schedules are written to Redis before the next round."""
        self.config = config
        self._unsynced: tuple[ScheduleSpec, ...] | None = config.schedules

    async def step(self) -> None:
        await self.link.reachability.pause(self._sleep)
        if self._unsynced is not None:
            await self.sync(self._unsynced)
        self._sleep = await self.round()

    async def sync(self, specs: tuple[ScheduleSpec, ...]) -> None:
        """Make Redis hold the config's schedules (schedule_store.sync_config); an unchanged one keeps its
        next tick, so a restart neither fires a tick twice nor skips one."""
        namespace, client = self.config.namespace, self.link.client
        done = await self.link.call(lambda: run_async(client, schedule_store.sync_config(namespace, specs)))
        if self._unsynced is specs:
            self._unsynced = None
        for name, what in sorted(done.items()):
            if what != "unchanged":
                log.info("schedule %s from the config", what, extra={"schedule": name})

    async def round(self) -> float:
        """Fire every due tick of every served queue; the seconds until the next round.

        Every step of the round goes in one round trip, after one read of the due schedules: a backlog of
        `all` ticks after a restart then takes no longer than one due tick, and the schedules after it are
        not late by its length (a `none` or `latest` schedule would count the ticks that came due
        meanwhile as passed over)."""
        try:
            read = await self._to_read()
            replies = await self.link.scripts([due_call(keys) for keys in read], each_its_own=True) if read else []
        except RedisUnavailable:
            self._sleep = 0.0  # at once when Redis answers again: ticks came due meanwhile
            raise
        waits: list[int] = []
        planned: list[tuple[QueueKeys, ScheduleSpec, list[Step], int]] = []
        broken: set[tuple[str, str]] = set()
        for keys, reply in zip(read, replies, strict=True):
            if isinstance(reply, Exception):
                self._without.discard(keys.queue)
                broken |= {b for b in self._broken if b[0] == keys.queue}  # not read: as it was
                continue  # a refusal, logged by the link: the other queues' schedules fire
            due = parse_due(reply)
            if due.next_in_ms is None and not due.schedules and not due.broken:
                self._without.add(keys.queue)  # no schedule waits in its ZSET: not read again while it has none
            else:
                self._without.discard(keys.queue)
            for name, key, holds in due.broken:
                broken.add((keys.queue, name))
                if (keys.queue, name) not in self._broken:
                    why = "schedule cannot fire: WRONGTYPE jobcar: %s holds a %s, not a hash; jobcar fsck repairs it"
                    log.error(why, key, holds, extra={"queue": keys.queue, "schedule": name})
            if due.next_in_ms is not None:
                waits.append(due.next_in_ms)
            for schedule in due.schedules:
                planned.append((keys, schedule.spec, plan(schedule.spec, schedule.next_ms, due.now_ms), due.now_ms))
        self._resync_repaired(broken)
        size = self.config.max_payload_bytes
        fires = [(keys, spec, step) for keys, spec, steps, _ in planned for step in steps]
        spans = tracing.schedule_fires(fires)  # with tracing on, a span per fire, the root of its job's trace
        calls = [fire_call(keys, spec, step, size, span.traceparent if span else None)
                 for (keys, spec, step), span in zip(fires, spans, strict=True)]  # fmt: skip
        replies = await self.link.scripts(calls, each_its_own=True) if calls else []
        tracing.schedules_fired(spans, replies)
        fired = iter(replies)
        for keys, spec, steps, now_ms in planned:
            # The schedules just fired wait at their next tick, which the read did not see.
            next_ms = self._record(keys, spec, [(step, next(fired)) for step in steps], now_ms)
            if next_ms is not None:
                waits.append(next_ms - now_ms)
        return min(MAX_SLEEP, max(0, min(waits)) / 1000 + TICK_MARGIN) if waits else MAX_SLEEP

    async def _to_read(self) -> list[QueueKeys]:
        """The queues whose schedules this round reads: those that had some at the last read, and the others
        too when any of their schedule ZSETs exists now (one EXISTS for all of them). An idle daemon whose
        queues have no schedule then costs one command per round, not a script per queue, and a schedule
        created elsewhere is still seen by the next round (ADR 0022)."""
        without = [keys for keys in self.queues if keys.queue in self._without]
        if without and await any_exists(self.link, [keys.schedules for keys in without]):
            self._without.clear()
        return [keys for keys in self.queues if keys.queue not in self._without]

    def _resync_repaired(self, broken: set[tuple[str, str]]) -> None:
        """A config schedule whose hash was of another type and no longer shows (fsck deleted it, with its
        index entry) is written again from the config before the next round, as a reload would."""
        repaired = {name for _, name in self._broken - broken}
        self._broken = broken
        if repaired & {spec.name for spec in self.config.schedules}:
            self._unsynced = self.config.schedules

    def _record(self, keys: QueueKeys, spec: ScheduleSpec, fired: list[tuple[Step, Reply]], now_ms: int) -> int | None:
        """Count and log what the schedule's steps did; the tick it then waits at (None: none left, or someone
        else moved it and the next round reads where to)."""
        series = self.metrics.schedule(spec.name)
        for step, reply in fired:
            if isinstance(reply, Exception):
                return None  # a refusal, logged by the link: the next round reads the schedule again
            done = parse_fire(reply)
            if done.outcome in ("moved", "paused", "missing", "early"):
                # Another daemon took the step, or the schedule changed (the later steps of the round then
                # changed nothing either): the next round reads it again, by the tick the step would have
                # moved to (every daemon computes the same), or at once.
                return fired[-1][0].next_ms if done.outcome == "moved" else now_ms
            if step.skipped:
                series.skipped.inc(step.skipped)
                log.info("schedule passed over %d tick(s) (catchup %s)", step.skipped, spec.catchup,
                         extra={"queue": keys.queue, "schedule": spec.name})  # fmt: skip
            if done.outcome == "overlap":
                series.skipped.inc()
                log.info("schedule tick skipped: its last job is still running (overlap skip)",
                         extra={"queue": keys.queue, "schedule": spec.name})  # fmt: skip
            elif done.outcome == "fired" and step.fire_ms is not None:
                series.fires.inc()
                series.lateness.observe(max(0, done.now_ms - step.fire_ms) / 1000)
                series.last_fire.set(step.fire_ms / 1000)
                log.debug("schedule fired", extra={"queue": keys.queue, "schedule": spec.name,
                                                   "job_id": done.job_id})  # fmt: skip
            if step.next_ms is not None:
                series.next_fire.set(step.next_ms / 1000)
        return fired[-1][0].next_ms if fired else None
