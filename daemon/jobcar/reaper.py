"""Crash recovery: jobs whose lease expired (their daemon died, froze or lost Redis) go back to pending, or
to the dead-letter queue when their attempts are spent. Any daemon reaps every queue it serves.

A pass runs at start-up and then when the earliest lease held in Redis expires, as the reap script reports
it in Redis time: a `kill -9`ed daemon's jobs are back within their lease, not a polling interval later.
While no served queue holds a lease or a limit group, a pass is one EXISTS and no script (ADR 0022)."""

from __future__ import annotations

import logging
from typing import Final

from jobcar.config_types import Config, limit_rules
from jobcar.keys import QueueKeys
from jobcar.loops import any_exists
from jobcar.metrics import Metrics
from jobcar.recording import dead_letter_limits
from jobcar.redis_link import RedisLink, RedisUnavailable
from jobcar.transitions import parse_reap, reap_call

log = logging.getLogger("jobcar.reaper")

#: The longest pause between two passes, whatever the lease.
MAX_INTERVAL: Final = 15.0
#: Slept past a reported expiry: the script reaps deadlines strictly before Redis's now.
EXPIRY_MARGIN: Final = 0.002


class Reaper:
    def __init__(self, queues: list[QueueKeys], link: RedisLink, metrics: Metrics, config: Config) -> None:
        self.queues = queues
        self.link = link
        self.metrics = metrics
        self.config = config
        self._next_pass_in = 0.0  # the first pass at start-up: leases may have expired while no daemon ran

    def apply(self, config: Config) -> None:
        self.config = config

    async def step(self) -> None:
        """The next pass when the earliest lease expires, at once when Redis answers again after an outage
        (leases that expired during it are due now), and at most MAX_INTERVAL after the last one."""
        await self.link.reachability.pause(self._next_pass_in)
        await self.reap(skip_idle=True)

    async def reap(self, *, skip_idle: bool = False) -> dict[str, dict[str, str]]:
        """One pass over every queue: queue -> {job id: where it went ("pending", "dead" or "missing")}.

        `skip_idle` (the loop's passes): first one EXISTS over every queue's active set and limit groups,
        and no reap script when none exists. Such a pass would find no lease to reap and no held job to let
        go, and write nothing: an idle daemon pays one command per pass, not a script per queue (ADR 0022).
        The next pass is then a lease from now at the latest, as after a pass that found no lease held."""
        queues = list(self.queues)  # the runner may add a queue (ADR 0027) while this pass waits for Redis
        watched = [key for keys in queues for key in (keys.active, keys.limit_groups)]
        try:
            if skip_idle and not await any_exists(self.link, watched):
                self._next_pass_in = min(self.config.lease, MAX_INTERVAL)
                return {}
        except RedisUnavailable:
            self._next_pass_in = 0.0
            raise
        limits = limit_rules(self.config)
        dead = dead_letter_limits(self.config)
        default_max_attempts = self.config.defaults.max_attempts
        calls = [reap_call(k, default_max_attempts=default_max_attempts, dead=dead, limits=limits) for k in queues]
        try:
            replies = await self.link.scripts(calls, each_its_own=True)
        except RedisUnavailable:
            self._next_pass_in = 0.0  # after the link's backoff, not a whole interval later
            raise
        reaped = {}
        # A lease taken after this pass expires a lease from now at the earliest: waking by then sees it in
        # time, though no lease is held now. (A daemon of the fleet configured with a shorter lease than this
        # one's could be late by the difference; the fleet's other daemons with that lease are not.)
        next_pass_in = min(self.config.lease, MAX_INTERVAL)
        for keys, reply in zip(queues, replies, strict=True):
            if isinstance(reply, Exception):
                continue  # a refusal (a key of the wrong type), logged by the link: the other queues are reaped
            result = parse_reap(reply)
            if result.next_expiry_in is not None:
                next_pass_in = min(next_pass_in, result.next_expiry_in + EXPIRY_MARGIN)
            reaped[keys.queue] = result.moved
            for job_id, where in result.moved.items():
                if where in ("pending", "dead"):
                    self.metrics.leases_reaped.labels(self.metrics.queue(keys.queue), where).inc()
                log.warning("recovered an expired lease: job %s", where, extra={"queue": keys.queue,
                            "job_id": job_id})  # fmt: skip
        self._next_pass_in = next_pass_in
        return reaped
