"""Leasing: which queue to lease from, when, and how many jobs, with backpressure.

A queue is "ready" until a lease finds it empty; then a watcher task blocks on the queue's wake list
(ADR 0002) and marks it ready again when work appears, and a timer does so when the earliest scheduled
job is due. On a daemon with one queue the watcher sends a lease behind its wait, which Redis runs as
soon as the wait ends (ADR 0005). The daemon never asks for more jobs than it has free slots: a lease
waiting behind a watcher holds its slots until its reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import redis.asyncio
from redis.asyncio.connection import AbstractConnection

from jobcar.app_health import HealthGate
from jobcar.attempts import Attempts
from jobcar.config_types import Config, limit_rules
from jobcar.heartbeat import AliveKey
from jobcar.keys import QueueKeys
from jobcar.metrics import Metrics
from jobcar.recording import dead_letter_limits
from jobcar.redis_link import RedisLink, RedisRefused, naming_key
from jobcar.scripts import Reply, ScriptCall
from jobcar.transitions import kill_call, lease_call, parse_lease
from jobcar.transport import AsyncRedis, closed_transport_is_connection_error, lease_on_wake

log = logging.getLogger("jobcar.leasing")

#: Most jobs one lease call takes (bounded by free slots too): big batches amortise round trips,
#: small ones keep one call short.
LEASE_BATCH_MAX: Final = 100
#: An idle queue is leased from at least this often even if no wake came (a lost wake, a paused
#: queue's lease script): its idle Redis traffic is a BLMOVE and a lease per this many seconds, the lease
#: running TIME and one EXISTS inside (ADR 0022; 5 s against 10 s measured there).
IDLE_WAIT_MAX: Final = 5.0
#: A watcher leaves a scheduled job due within its wait (plus this margin) to the daemon's timer: Redis
#: ends a BLMOVE on timeout only at its next cron tick (100 ms apart at the default hz 10).
DUE_MARGIN: Final = 1.0
#: The wake list's element that a script leaving an entry in the queue's settled list pushes
#: (lua/includes/wake.lua): the watcher it wakes tells the settler (ADR 0022). Work pushes "1".
SETTLED_WAKE: Final = b"settled"
#: How long a queue whose lease Redis refused (a key of the queue holding the wrong type, say) is left
#: aside before the next try (seconds): the other queues lease meanwhile.
REFUSED_QUEUE_PAUSE: Final = 10.0
#: At a drain, how long the daemon waits for the replies of leases still queued behind watchers' waits.
DRAIN_WAKE_MAX: Final = 2.0


@dataclass
class QueueState:
    keys: QueueKeys
    weight: int
    ready: bool = True
    due_at: float | None = None  # monotonic time when its earliest scheduled job is due
    went_idle: asyncio.Event = field(default_factory=asyncio.Event)
    reserved: int = 0  # slots held by a lease waiting behind the watcher's BLMOVE

    def idle(self, next_due_ms: int | None) -> None:
        self.ready = False
        self.due_at = None if next_due_ms is None else time.monotonic() + next_due_ms / 1000
        self.went_idle.set()

    def runnable(self, now: float) -> bool:
        return self.ready or (self.due_at is not None and self.due_at <= now)


def pick(candidates: list[QueueState], strict_priority: bool) -> QueueState:
    """The queue to lease from: the first with `strict_priority`, else drawn in proportion to the weights."""
    if strict_priority or len(candidates) == 1:
        return candidates[0]
    return random.choices(candidates, weights=[q.weight for q in candidates])[0]


class Leaser:
    """Leases jobs from the configured queues and hands them to `attempts`.

    `changed` is set whenever the lease loop should look again: a slot was freed, a queue became ready,
    the config was reloaded or the drain began. With `alive` (a one-queue daemon), watchers queue a
    lease behind their idle wait (ADR 0005).
    """

    def __init__(
        self,
        queues: list[QueueState],
        link: RedisLink,
        attempts: Attempts,
        metrics: Metrics,
        app_health: HealthGate,
        changed: asyncio.Event,
        draining: asyncio.Event,
        alive: AliveKey | None,
    ) -> None:
        self.queues = queues
        self.link = link
        self.attempts = attempts
        self.metrics = metrics
        self.app_health = app_health
        self.changed = changed
        self.draining = draining
        self.alive = alive
        self._wait_connection: AbstractConnection | None = None
        #: Told the queue of each wait that a settled wake ended (the runner's settler).
        self.on_settled: Callable[[str], None] = lambda queue: None

    def apply(self, config: Config) -> None:
        self.config = config
        self._lease_ms = int(config.lease * 1000)
        self._max_attempts_by_type = json.dumps({t: h.max_attempts for t, h in config.handlers.items()})
        self._dead_letter = dead_letter_limits(config)
        self._limits = limit_rules(config)

    def free_slots(self) -> int:
        return self.config.concurrency - len(self.attempts.running) - sum(q.reserved for q in self.queues)

    # -- the lease loop -----------------------------------------------------------------------------

    async def step(self) -> None:
        """Lease once from a runnable queue, or wait until there is a slot and a queue to lease from."""
        self.changed.clear()
        if not self.app_health.healthy(self.config.health_url):
            # The app is not up: jobs wait in Redis, where another daemon (or later we) can run them.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.app_health.wait(self.config.health_url), 1.0)
            return
        free = self.free_slots()
        now = time.monotonic()
        candidates = [q for q in self.queues if q.runnable(now)]
        if free <= 0 or not candidates:
            dues = [q.due_at - now for q in self.queues if q.due_at is not None and not q.ready]
            timeout = max(0.0, min(dues)) if dues and free > 0 else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout)
            return
        queue = pick(candidates, self.config.strict_priority)
        count = min(free, LEASE_BATCH_MAX)
        try:
            (reply,) = await self.link.scripts([self._lease(queue, count)])
        except RedisRefused:  # counted and logged by the link; not an outage, and not the other queues' fault
            queue.idle(int(REFUSED_QUEUE_PAUSE * 1000))
            return
        await self._take(queue, count, reply)

    def _lease(self, queue: QueueState, count: int, alive_key: str | None = None) -> ScriptCall:
        return lease_call(queue.keys, count, self._lease_ms, self.config.defaults.max_attempts,
                          self._max_attempts_by_type, alive_key, self._dead_letter, self._limits)  # fmt: skip

    async def _take(self, queue: QueueState, count: int, reply: Reply) -> None:
        """Start the jobs a lease of `count` returned, and mark the queue idle if it ran short."""
        result = parse_lease(queue.keys, reply)
        if result.declined and self.alive is not None:
            # Our alive key lapsed (a stalled heartbeat, a flushed or restarted server): plain waits until
            # a beat refreshes it; without this, a wake left in place would make every wait return at once.
            self.alive.until = 0.0
        series = self.metrics.of_queue(queue.keys.queue)
        series.leased.inc(len(result.jobs))
        for leased in result.jobs:
            job = leased.job
            series.wait.observe(max(0, result.now_ms - job.ready_ms) / 1000)
            if job.held_at_ms is not None:
                self.metrics.of_held(job.queue, job.type).observe(max(0, result.now_ms - job.held_at_ms) / 1000)
            self.attempts.start(queue.keys, leased)
        if result.paused:
            queue.idle(None)  # resume pushes a wake; due jobs wait for it
        elif len(result.jobs) < count:
            # Empty (or emptied) for now: wait for a wake, or for the earliest scheduled job.
            queue.idle(result.next_due_ms)
        if result.expired:
            self.metrics.jobs_expired.labels(self.metrics.queue(queue.keys.queue)).inc(len(result.expired))
        for job_id in result.expired:
            log.info("job not started by its deadline; moved to the dead-letter queue",
                     extra={"queue": queue.keys.queue, "job_id": job_id})  # fmt: skip
        for job_id, why in result.dropped:
            log.error("job id dropped from the pending list: %s", why, extra={"queue": queue.keys.queue,
                      "job_id": job_id})  # fmt: skip
        if result.malformed:
            kills = [kill_call(queue.keys, job_id, token, f"malformed job: {problem}", self._dead_letter)
                     for job_id, token, problem in result.malformed]  # fmt: skip
            for job_id, _, _ in result.malformed:
                log.error("malformed job hash; moved to the dead-letter queue", extra={"job_id": job_id})
            await self.link.scripts(kills)

    def redis_recovered(self) -> None:
        """Lease from every queue at once after an outage: jobs enqueued meanwhile are waiting, and the
        watchers' blocked calls (and the wakes they were waiting for) were most likely lost with it."""
        for queue in self.queues:
            queue.ready = True
        self.changed.set()

    # -- watchers -----------------------------------------------------------------------------------

    async def watch(self, queue: QueueState) -> None:
        """Block on the queue's wake list while it is idle, then mark it ready (ADR 0002), or, with a lease
        sent behind the wait, start what it leased (ADR 0005)."""
        await queue.went_idle.wait()
        count = self._lease_on_wake_count(queue)
        # IDLE_WAIT_MAX is whole seconds: redis-py types the timeout as int (the server takes decimals).
        wake, timeout = queue.keys.wake, int(IDLE_WAIT_MAX)

        async def wait() -> tuple[Reply, Reply]:
            """(the wake's element that ended the wait, None at the timeout; the lease's reply when one was sent
            behind it)."""
            if count and self.alive is not None:
                call = self._lease(queue, count, alive_key=self.alive.key)
                return await lease_on_wake(await self._wait_target(), wake, timeout, call)
            with closed_transport_is_connection_error():
                try:
                    woken_by = await self.link.blocking_client.blmove(wake, wake, timeout, "RIGHT", "RIGHT")
                except redis.exceptions.ResponseError as exc:
                    raise naming_key(exc, wake, "list") from None
            return woken_by, None

        with self._reserved(queue, count):
            try:
                # RedisUnavailable: the queue stays idle, the next pass blocks again
                woken_by, reply = await self.link.call(wait)
            except RedisRefused:
                # A full server refuses the plain wait (BLMOVE is a write) but not the lease (ADR 0008): lease
                # instead, at the refusal's pace (the link paused before raising), until the wait is accepted.
                queue.went_idle.clear()
                queue.ready = True
                return
            queue.went_idle.clear()
            queue.ready = True
            if woken_by == SETTLED_WAKE:
                # The script that left an ended dependency's entry in the settled list woke the queue: the
                # settler looks at once (ADR 0022). A job's wake costs it nothing.
                self.on_settled(queue.keys.queue)
            if count:
                await self._take(queue, count, reply)
                # Let the jobs just started send their requests before this task re-arms its wait:
                # building that pipeline costs Python time that would delay every pickup.
                await asyncio.sleep(0)

    async def _wait_target(self) -> AsyncRedis | AbstractConnection:
        """Where a one-queue daemon's watcher sends its wait and lease: a connection of its own, checked
        out of the blocking client's pool once (given back by `close`); on Cluster, the client
        (transport.lease_on_wake)."""
        blocking = self.link.blocking_client
        if not isinstance(blocking, redis.asyncio.Redis):
            return blocking
        pool = blocking.connection_pool
        if self._wait_connection is None:
            self._wait_connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        else:
            # The pool's check-out probe, kept: a connection the server closed while the queue was busy
            # (a restart) is replaced unseen, instead of failing its next wait as a second outage.
            await pool.ensure_connection(self._wait_connection)
        return self._wait_connection

    @contextlib.contextmanager
    def _reserved(self, queue: QueueState, count: int) -> Iterator[None]:
        """Hold `count` slots for a lease sent behind a wait, until its jobs are running or it failed."""
        queue.reserved = count
        try:
            yield
        finally:
            queue.reserved = 0
            self.changed.set()

    def _lease_on_wake_count(self, queue: QueueState) -> int:
        """How many jobs the watcher of an idle queue leases behind its wait; 0 for a plain wait.

        Only on a daemon with one queue (`alive` is set): a lease waiting behind one queue's wait holds
        slots that another queue's jobs could need meanwhile. Only while the heartbeat keeps the alive
        key that guards it. Never while draining or while the app is unhealthy, and not when a scheduled
        job is due before the wait ends: the daemon's timer leases that one on time.
        """
        if self.alive is None or len(self.queues) != 1 or not self.alive.surely_exists():
            return 0  # a reload's pattern may have added queues to a one-queue daemon (ADR 0027)
        if self.draining.is_set() or not self.app_health.healthy(self.config.health_url):
            return 0
        if queue.due_at is not None and queue.due_at < time.monotonic() + IDLE_WAIT_MAX + DUE_MARGIN:
            return 0
        return max(0, min(LEASE_BATCH_MAX, self.config.concurrency - len(self.attempts.running)))

    async def collect_leases_on_wake(self) -> None:
        """At a drain, wake the watchers whose lease still waits behind their BLMOVE and take the replies:
        the lease runs whenever a wake comes, and cancelling the wait could drop a reply carrying jobs
        (they would sit leased until their lease expired). The jobs it took go straight back
        (Attempts._check_may_start). Extra elements on a wake list are harmless: the next lease that finds
        nothing pending deletes it."""
        waiting = [q for q in self.queues if q.reserved]
        if not waiting:
            return
        # The replies are awaited, not the wakes: a reply already on its way may arrive first.
        client = self.link.client
        wakes = [asyncio.ensure_future(client.rpush(q.keys.wake, "1")) for q in waiting]
        try:
            async with asyncio.timeout(DRAIN_WAKE_MAX):
                while any(q.reserved for q in self.queues):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            # If the lease still runs, the reaper of any daemon recovers its jobs once their lease expires.
            log.warning("no reply from a lease sent behind a wait within %.0f s; exiting without it", DRAIN_WAKE_MAX)
        finally:
            for wake in wakes:
                wake.cancel()
            # Awaited through a gather that keeps their errors: an error left unread is logged as a traceback.
            await asyncio.gather(*wakes, return_exceptions=True)

    async def close(self) -> None:
        """Give the watcher's own connection back to its pool (after every watcher is gone)."""
        blocking = self.link.blocking_client
        if self._wait_connection is not None and isinstance(blocking, redis.asyncio.Redis):
            await blocking.connection_pool.release(self._wait_connection)
            self._wait_connection = None
