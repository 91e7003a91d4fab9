"""Lease renewal and self-fencing: the leases of jobs still running here are renewed every third of the
lease, and an attempt whose lease is lost, or was not renewed in time, is abandoned before another
daemon can run the same job.

On a daemon that queues a lease behind its idle wait (ADR 0005), each beat also refreshes the daemon's
alive key, which guards that lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from jobcar.attempts import Attempts, RunningJob, StopReason
from jobcar.metrics import Metrics
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.scripts import Reply
from jobcar.transitions import ExtendStatus, extend_call, parse_extend
from jobcar.transport import execute_async

log = logging.getLogger("jobcar.heartbeat")


@dataclass
class AliveKey:
    """The key a lease queued behind an idle wait needs to find (ADR 0005): it exists while this daemon
    beats. `until` is the monotonic time until which it surely exists (0: not known to exist)."""

    key: str
    until: float = 0.0

    def surely_exists(self) -> bool:
        return self.until > time.monotonic()


class Heartbeat:
    def __init__(
        self, attempts: Attempts, link: RedisLink, metrics: Metrics, lease: float, alive: AliveKey | None
    ) -> None:
        self.attempts = attempts
        self.link = link
        self.metrics = metrics
        self.lease = lease
        self.alive = alive

    async def beat(self) -> None:
        """One renewal, then a third of the lease's sleep: the heartbeat loop's step."""
        await self.renew()
        await asyncio.sleep(self.lease / 3)

    async def renew(self) -> None:
        """Renew the leases of the attempts running here. An attempt is abandoned when its lease is lost, and
        also when it was not renewed for two thirds of the lease: it could expire before the next beat,
        and another daemon could then run the job too.

        The alive key is refreshed for two thirds of the lease: it lapses before any lease the beat
        renewed, so a daemon frozen with a lease queued behind its wait cannot take the jobs a reaper
        returns from it (ADR 0005). The first beat is at start-up, so the key exists before the first
        idle wait."""
        interval = self.lease / 3
        by_queue: dict[str, list[RunningJob]] = {}
        for running in self.attempts.running.values():
            # Jobs being stopped still need their lease: they are given back or acked as canceled. One whose
            # handler answered through the handler API holds none any more.
            if running.stop_reason is not StopReason.LEASE_LOST and not running.answered:
                by_queue.setdefault(running.keys.queue, []).append(running)
        groups = list(by_queue.values())
        lease_ms = int(self.lease * 1000)
        calls = [extend_call(g[0].keys, lease_ms, [(r.job.id, r.leased.token) for r in g]) for g in groups]
        sent = time.monotonic()

        async def send() -> None:
            if calls:
                # Each queue's renewals stand on their own: a refusal (a key of the wrong type) leaves that
                # queue's leases unrenewed, not every queue's.
                replies = await execute_async(self.link.client, calls, raise_on_error=False)
                outage = self.link.note_refusals(replies)
                self._renewed(groups, replies, sent)
                if outage is not None:
                    raise outage  # inside `call`: counted as the outage it is, once the renewals that stand count
            if self.alive is not None:
                await self._refresh_alive_key(self.alive)

        try:
            # No backoff beyond the beat's own pace (a beat per interval, each bounded by it): a longer
            # sleep would let the leases lapse (and the attempts be abandoned) after Redis is back.
            await self.link.call(send, guard=False, time_limit=interval, deadline=sent)
        except RedisUnavailable:
            pass
        finally:
            self._abandon_stale(time.monotonic(), interval)

    async def _refresh_alive_key(self, alive: AliveKey) -> None:
        ttl = self.lease * 2 / 3
        sent = time.monotonic()
        await self.link.client.set(alive.key, "1", px=max(1, int(ttl * 1000)))
        alive.until = sent + ttl  # no later than Redis's own expiry: the SET ran after `sent`

    def _renewed(self, groups: list[list[RunningJob]], replies: list[Reply], sent: float) -> None:
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, Exception):
                continue  # not renewed (noted by the link): `_abandon_stale` stops these attempts if it lasts
            for running, status in zip(group, parse_extend(reply), strict=True):
                if self.attempts.running.get((running.keys.queue, running.job.id)) is not running:
                    # The attempt ended while the beat was on the wire and its outcome call decides now. A
                    # LOST here most often only means that its ack got there first: stopping the attempt
                    # would cancel the outcome call and count a lease lost that was not.
                    if status is not ExtendStatus.LOST:
                        running.last_renewed = sent  # the outcome call may retry that much longer
                    continue
                queue_label = self.metrics.queue(running.job.queue)
                if status is ExtendStatus.LOST:
                    log.warning("lease lost; abandoning the attempt", extra={"queue": running.job.queue,
                                "job_id": running.job.id})  # fmt: skip
                    self.metrics.leases_lost.labels(queue_label).inc()
                    self.attempts.stop(running, StopReason.LEASE_LOST)
                    continue
                self.metrics.leases_renewed.labels(queue_label).inc()
                running.last_renewed = sent  # the new deadline counts from no earlier than the send
                if status is ExtendStatus.CANCEL_REQUESTED:
                    self.attempts.stop(running, StopReason.CANCELED)

    def _abandon_stale(self, now: float, interval: float) -> None:
        for running in list(self.attempts.running.values()):
            if running.answered:
                continue  # its outcome is recorded: it needs no lease to finish, only its timeout
            if running.stop_reason is None and now - running.last_renewed > self.lease - interval:
                log.error("lease could not be renewed in time; abandoning the attempt",
                          extra={"queue": running.job.queue, "job_id": running.job.id})  # fmt: skip
                self.metrics.leases_lost.labels(self.metrics.queue(running.job.queue)).inc()
                self.attempts.stop(running, StopReason.LEASE_LOST)
