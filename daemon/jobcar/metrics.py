"""Prometheus metrics (CONVENTIONS, Operations): `jobcar_` prefix, base units, counters ending in
`_total`, and bounded labels only — queue names and job types from the config (anything else is
counted as "other"), outcomes, states. Every label set a config implies is created at 0, so rates and
alerts work before the first job.

Queue depths are read from Redis when Prometheus scrapes, one stats script per queue in one round
trip, cached for a second so several scrapers cost Redis no more.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jobcar import __version__, store
from jobcar.config_types import Config
from jobcar.job import STORED_IN_SETS

#: How a finished attempt ended, as recorded in Redis.
OUTCOMES: Final = ("done", "retried", "dead", "canceled", "returned", "lease_lost")
OTHER: Final = "other"
STATS_CACHE_SECONDS: Final = 1.0
DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
WAIT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 900, 3600, 14400, 86400)


@dataclass(frozen=True, slots=True)
class QueueSeries:
    """The per-job series of one queue, resolved once: `labels()` costs a lock and a dict lookup."""

    leased: Counter
    wait: Histogram
    in_flight: Gauge


@dataclass(frozen=True, slots=True)
class JobSeries:
    """The per-job series of one queue and type, resolved once."""

    duration: Histogram
    finished: dict[str, Counter]  # outcome -> its counter


class Metrics:
    def __init__(self, config: Config) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.leased = Counter("jobcar_jobs_leased", "Jobs leased from Redis to run.", ["queue"], registry=r)
        self.finished = Counter(
            "jobcar_jobs_finished", "Attempts by how they were recorded in Redis.", ["queue", "type", "outcome"],
            registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "jobcar_job_duration_seconds", "Time a handler took for one attempt.", ["queue", "type"],
            buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.wait = Histogram(
            "jobcar_job_wait_seconds", "Time from enqueue (or run-at) until the attempt was leased.", ["queue"],
            buckets=WAIT_BUCKETS, registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("jobcar_jobs_in_flight", "Jobs this daemon is running now.", ["queue"], registry=r)
        self.leases_renewed = Counter("jobcar_leases_renewed", "Leases renewed by heartbeats.", ["queue"], registry=r)
        self.leases_lost = Counter(
            "jobcar_leases_lost", "Attempts abandoned because their lease was lost or could not be renewed.",
            ["queue"], registry=r,
        )  # fmt: skip
        self.leases_reaped = Counter(
            "jobcar_leases_reaped", "Expired leases recovered by this daemon's reaper, by where the job went.",
            ["queue", "to"], registry=r,
        )  # fmt: skip
        self.redis_errors = Counter("jobcar_redis_errors", "Redis calls that failed or were refused.", registry=r)
        self.reloads = Counter("jobcar_config_reloads", "Config reloads (SIGHUP) by result.", ["result"], registry=r)
        self.queue_jobs = Gauge(
            "jobcar_queue_jobs", "Jobs in Redis by queue and state.", ["queue", "state"], registry=r
        )
        self.queue_latency = Gauge(
            "jobcar_queue_latency_seconds", "Age of the oldest runnable job of the queue.", ["queue"], registry=r
        )
        self.queue_paused = Gauge("jobcar_queue_paused", "1 while the queue is paused.", ["queue"], registry=r)
        build = Gauge("jobcar_build_info", "jobcar's version.", ["version", "python"], registry=r)
        build.labels(__version__, platform.python_version()).set(1)
        self._stats_at = 0.0
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Bound the labels to the config's queues and types and create their label sets at 0."""
        self.queues = frozenset(config.queues)
        self.types = frozenset(config.handlers)
        self._queue_series: dict[str, QueueSeries] = {}
        self._job_series: dict[tuple[str, str], JobSeries] = {}
        queues = [*self.queues, OTHER]
        types = [*self.types, OTHER]
        for q in queues:
            self.leased.labels(q)
            self.wait.labels(q)
            self.in_flight.labels(q)
            self.leases_renewed.labels(q)
            self.leases_lost.labels(q)
            for to in ("pending", "dead"):
                self.leases_reaped.labels(q, to)
            for t in types:
                self.duration.labels(q, t)
                for outcome in OUTCOMES:
                    self.finished.labels(q, t, outcome)
        for q in self.queues:
            for state in STORED_IN_SETS:
                self.queue_jobs.labels(q, state.value)
            self.queue_latency.labels(q)
            self.queue_paused.labels(q)
        for result in ("ok", "failed"):
            self.reloads.labels(result)

    def queue(self, name: str) -> str:
        return name if name in self.queues else OTHER

    def type(self, name: str) -> str:
        return name if name in self.types else OTHER

    def of_queue(self, queue: str) -> QueueSeries:
        series = self._queue_series.get(queue)
        if series is None:
            label = self.queue(queue)
            series = QueueSeries(self.leased.labels(label), self.wait.labels(label), self.in_flight.labels(label))
            self._queue_series[queue] = series
        return series

    def of_job(self, queue: str, job_type: str) -> JobSeries:
        series = self._job_series.get((queue, job_type))
        if series is None:
            labels = (self.queue(queue), self.type(job_type))
            finished = {outcome: self.finished.labels(*labels, outcome) for outcome in OUTCOMES}
            series = JobSeries(self.duration.labels(*labels), finished)
            self._job_series[(queue, job_type)] = series
        return series

    async def render(self, client: store.AsyncRedis, queues: Iterable[store.QueueKeys]) -> bytes:
        """The exposition, with queue depths refreshed from Redis at most once a second."""
        if time.monotonic() - self._stats_at > STATS_CACHE_SECONDS:
            keys = list(queues)
            replies = await store.execute_async(client, [store.stats_call(k) for k in keys])
            for k, reply in zip(keys, replies, strict=True):
                stats = store.parse_stats(k, reply)
                for state in STORED_IN_SETS:
                    self.queue_jobs.labels(k.queue, state.value).set(getattr(stats, state.value))
                self.queue_latency.labels(k.queue).set(stats.latency_s)
                self.queue_paused.labels(k.queue).set(1 if stats.paused else 0)
            self._stats_at = time.monotonic()
        return generate_latest(self.registry)
