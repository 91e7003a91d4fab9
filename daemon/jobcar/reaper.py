"""Crash recovery: jobs whose lease expired (their daemon died, froze or lost Redis) go back to pending, or
to the dead-letter queue when their attempts are spent. Any daemon reaps every queue it serves."""

from __future__ import annotations

import logging

from jobcar.config_types import Config
from jobcar.keys import QueueKeys
from jobcar.metrics import Metrics
from jobcar.recording import dead_letter_limits
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.transitions import parse_reap, reap_call

log = logging.getLogger("jobcar.reaper")

#: The longest pause between two passes, whatever the lease.
MAX_INTERVAL = 15.0


class Reaper:
    def __init__(self, queues: list[QueueKeys], link: RedisLink, metrics: Metrics, config: Config) -> None:
        self.queues = queues
        self.link = link
        self.metrics = metrics
        self.config = config
        self._failed = False

    async def step(self) -> None:
        """A pass every half lease (at most MAX_INTERVAL), and at once when Redis answers again after an
        outage: leases that expired during it are due now."""
        if not self._failed:
            await self.link.reachability.pause(max(0.2, min(self.config.lease / 2, MAX_INTERVAL)))
        await self.reap()

    async def reap(self) -> dict[str, dict[str, str]]:
        """One pass over every queue: queue -> {job id: where it went ("pending", "dead" or "missing")}."""
        calls = [
            reap_call(
                keys, default_max_attempts=self.config.defaults.max_attempts, dead=dead_letter_limits(self.config)
            )
            for keys in self.queues
        ]
        try:
            replies = await self.link.scripts(calls)
        except RedisUnavailable:
            self._failed = True  # the next pass comes after the backoff, not a whole interval later
            raise
        self._failed = False
        reaped = {}
        for keys, reply in zip(self.queues, replies, strict=True):
            reaped[keys.queue] = parse_reap(reply)
            for job_id, where in reaped[keys.queue].items():
                if where in ("pending", "dead"):
                    self.metrics.leases_reaped.labels(self.metrics.queue(keys.queue), where).inc()
                log.warning("recovered an expired lease: job %s", where, extra={"queue": keys.queue,
                            "job_id": job_id})  # fmt: skip
        return reaped
