"""The daemon's job loop, wired from its parts: leasing hands jobs to attempts, the heartbeat renews
their leases, the reaper recovers other daemons' expired ones; the runner starts them, reloads their
config and drains them.

    leasing ──start──> attempts ──record outcome──> Redis (through redis_link)
    heartbeat ──renew / fence──> attempts            reaper ──> Redis
    attempts ──a job others wait for ended──> settler ──> Redis (the waiting jobs)
    leasing ──a settled wake (an ended dependency another process left)──> settler
    attempts ──count──> history ──every 5 s──> Redis
    announcer ──this daemon, every 5 s──> Redis (the fleet the dashboard shows)
    queue discovery ──a queue a pattern matches──> runner ──its watcher, its keys to every part (ADR 0027)

A drain stops leasing, collects the leases still queued behind idle waits, and settles the attempts:
in-flight jobs get shutdown_timeout to finish, the rest go back to pending without spending an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import Mapping

from jobcar.app_health import AlwaysHealthy, HealthGate
from jobcar.attempt_desk import AttemptDesk
from jobcar.attempts import Attempts, StopReason
from jobcar.config_types import Config
from jobcar.executors import Executor
from jobcar.fleet import Announcer
from jobcar.heartbeat import AliveKey, Heartbeat
from jobcar.history import History
from jobcar.keys import QueueKeys
from jobcar.leasing import Leaser, QueueState
from jobcar.loops import forever, spawn
from jobcar.metrics import Metrics
from jobcar.queue_discovery import QueueDiscovery
from jobcar.queue_settings import QueueSettings
from jobcar.reaper import Reaper
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.scheduler import Scheduler
from jobcar.settler import Settler

log = logging.getLogger("jobcar.runner")


class Runner:
    """Runs jobs from the configured queues until `drain()` is called and in-flight work is settled."""

    def __init__(
        self,
        config: Config,
        link: RedisLink,
        executors: Mapping[str, Executor],
        app_health: HealthGate | None = None,
        metrics: Metrics | None = None,
        desk: AttemptDesk | None = None,
    ) -> None:
        self.link = link
        #: The running attempts as their handlers may call them back (the daemon's handler API finds them here).
        self.desk = desk or AttemptDesk()
        self.metrics = metrics or Metrics(config)
        app_health = app_health or AlwaysHealthy()
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._draining = asyncio.Event()
        queues = [QueueState(QueueKeys.of(config.namespace, q), w) for q, w in config.queues.items()]
        # ADR 0005: a one-queue daemon queues a lease behind its idle wait, guarded by its alive key (not one
        # whose patterns may add queues, ADR 0027).
        one = len(queues) == 1 and not config.queue_patterns
        alive = AliveKey(queues[0].keys.alive(secrets.token_hex(8))) if one else None
        self.history = History(config.namespace, link, list(config.queues))
        self.attempts = Attempts(link, self.metrics, self.history, app_health, self._changed, self._draining,
                                 self.desk)  # fmt: skip
        self.leaser = Leaser(queues, link, self.attempts, self.metrics, app_health, self._changed,
                             self._draining, alive)  # fmt: skip
        self.heartbeat = Heartbeat(self.attempts, link, self.metrics, config.lease, alive)
        self.reaper = Reaper([q.keys for q in queues], link, self.metrics, config)
        self.scheduler = Scheduler([q.keys for q in queues], link, self.metrics, config)
        self.settler = Settler([q.keys for q in queues], link, config)
        self.queue_settings = QueueSettings([q.keys for q in queues], link, config)
        self._running = False
        self.discovery = QueueDiscovery(link, config, self.serve)
        self.announcer = Announcer(link, config, lambda: self.in_flight, lambda: self.discovery.found)
        self.attempts.on_dependents = self.settler.wake
        self.leaser.on_settled = self.settler.wake
        link.reachability.on_recovery = self.leaser.redis_recovered
        self.apply(config, executors)

    def apply(self, config: Config, executors: Mapping[str, Executor]) -> None:
        """Take a (re)loaded config's handlers. Running jobs finish with the executor they started with."""
        self.config = config
        # Every part takes a config the same way; the attempts also take the executors built for it.
        self.attempts.apply(config, executors)
        for part in (
            self.metrics,
            self.history,
            self.leaser,
            self.reaper,
            self.scheduler,
            self.settler,
            self.announcer,
            self.queue_settings,
            self.discovery,
        ):
            part.apply(config)
        self._changed.set()

    def serve(self, queue: str, weight: int) -> None:
        """Serve `queue` from now on with `weight` (a queue a pattern matched, ADR 0027): its watcher, its keys
        in the reaper's, scheduler's, settler's, settings' and history's lists; or, already served, take the
        weight. Never undone while the daemon runs."""
        for state in self.leaser.queues:
            if state.keys.queue == queue:
                state.weight = weight
                return
        keys = QueueKeys.of(self.config.namespace, queue)
        state = QueueState(keys, weight)  # ready: the next lease step looks at it
        self.leaser.queues.append(state)
        self.reaper.queues.append(keys)
        self.scheduler.queues.append(keys)
        self.settler.queues[queue] = keys
        self.queue_settings.add(keys)
        self.history.queues.append(queue)
        if self._running and not self.draining:
            self._watch(state)
        log.info("serving a queue its pattern matches, weight %d", weight, extra={"queue": queue})
        self._changed.set()

    def _watch(self, state: QueueState) -> None:
        name = f"watch {state.keys.queue}"
        spawn(name, forever(name, functools.partial(self.leaser.watch, state), self.link.reachability), self._tasks)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    @property
    def in_flight(self) -> int:
        return len(self.attempts.running)

    async def run(self) -> None:
        """Lease and run jobs until drain() is called, then settle in-flight jobs and return."""
        reachability = self.link.reachability
        self._running = True
        for q in self.leaser.queues:
            self._watch(q)
        spawn("heartbeat", forever("heartbeat", self.heartbeat.beat, reachability), self._tasks)
        spawn("reaper", forever("reaper", self.reaper.step, reachability), self._tasks)
        spawn("history", forever("history", self.history.step, reachability), self._tasks)
        spawn("scheduler", forever("scheduler", self.scheduler.step, reachability), self._tasks)
        spawn("settler", forever("settler", self.settler.step, reachability), self._tasks)
        spawn("announcer", forever("announcer", self.announcer.step, reachability), self._tasks)
        spawn("queue settings", forever("queue settings", self.queue_settings.step, reachability), self._tasks)
        spawn("queue discovery", forever("queue discovery", self.discovery.step, reachability), self._tasks)
        try:
            while not self._draining.is_set():
                try:
                    await self.leaser.step()
                except RedisUnavailable:
                    pass  # counted and backed off by RedisLink.call
                except Exception:
                    # A bug must not end the daemon with jobs in flight: say so loudly and go on.
                    log.exception("lease loop: unexpected error; continuing")
                    await asyncio.sleep(1)
            await self.leaser.collect_leases_on_wake()
            await self.attempts.settle(self.config.shutdown_timeout)
            with contextlib.suppress(RedisUnavailable):  # the last counts; lost only if Redis is away now
                await self.history.flush()
            with contextlib.suppress(RedisUnavailable):  # else the entry stops being live on its own
                await self.announcer.withdraw()
        finally:
            # Cancel until every task is gone: a cancel swallowed inside redis-py (see
            # `current_task_cancelling`) can leave a task waiting on an event nobody will set.
            pending = set(self._tasks)
            while pending:
                for task in pending:
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=1)
            await self.leaser.close()

    def drain(self) -> None:
        """Stop leasing; run() then waits up to shutdown_timeout for in-flight jobs."""
        if not self._draining.is_set():
            self.attempts.in_flight_at_drain = self.in_flight
            log.info("no more leases; %d jobs in flight", self.in_flight)
        self._draining.set()
        self._changed.set()

    def stop_now(self) -> None:
        """The second signal: give every in-flight job back now instead of waiting for it."""
        self.drain()
        self.attempts.stop_all(StopReason.SHUTDOWN)
