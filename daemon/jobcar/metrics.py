"""Prometheus metrics, named as Prometheus recommends: `jobcar_` prefix, base units, counters ending in
`_total`, and bounded labels only — queue names and job types from the config (anything else is
counted as "other"), outcomes, states. Every label set a config implies is created at 0, so rates and
alerts work before the first job.

Queue depths are read from Redis when Prometheus scrapes, one stats script per queue in one round
trip, cached for a second so several scrapers cost Redis no more.

The series that move with every job (leased, wait, in flight, duration, finished) are plain numbers
in `JobFlow`, rendered by its collector: a prometheus_client value takes a lock per change, six
changes per job (ADR 0006). The daemon
changes and reads them on its event loop thread only; the rarer series keep prometheus_client's types.

No `*_created` series: prometheus_client adds one per counter and histogram label set by default, a second
series for each that only says when the daemon made it (the process start, for label sets created at 0),
which Prometheus stores as series of their own and no dashboard or alert here reads.
"""

from __future__ import annotations

import contextlib
import platform
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from jobcar import __version__, keys, transitions, transport
from jobcar.config_types import Config
from jobcar.job import STORED_IN_SETS, State

#: How a finished attempt ended, as recorded in Redis.
OUTCOMES: Final = ("done", "retried", "dead", "canceled", "returned", "lease_lost")
OTHER: Final = "other"
STATS_CACHE_SECONDS: Final = 1.0
#: The states jobcar_queue_jobs counts: the state sets, and jobs held by a concurrency limit.
GAUGED_STATES: Final = (*STORED_IN_SETS, State.HELD)
DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
LATENESS_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300)
BATCH_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
WAIT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 900, 3600, 14400, 86400)
_go_float: Callable[[float], str] = floatToGoString  # the `le` spelling of prometheus_client's Histogram


class Tally:
    """The value of a counter or a gauge, without a lock (see the module's docstring)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class Distribution:
    """The buckets, count and sum of a histogram, without a lock. `counts[i]` holds the observations in
    (bounds[i-1], bounds[i]], the last one those above every bound; rendered cumulative, as Prometheus
    wants. With tracing on, each bucket keeps the latest observation's trace as its exemplar (OpenMetrics)."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        #: Per bucket, its latest exemplar; None until the first observation that has one (tracing off: never).
        self.exemplars: list[Exemplar | None] | None = None

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        index = bisect_left(self.bounds, value)
        self.counts[index] += 1
        self.sum += value
        if exemplar is not None:
            if self.exemplars is None:
                self.exemplars = [None] * len(self.counts)
            self.exemplars[index] = Exemplar(exemplar, value, time.time())

    def cumulative(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        total = 0
        buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        exemplars = self.exemplars or [None] * len(self.counts)
        for bound, count, exemplar in zip((*self.bounds, float("inf")), self.counts, exemplars, strict=True):
            total += count
            buckets.append((_go_float(bound), float(total)) if exemplar is None else
                           (_go_float(bound), float(total), exemplar))  # fmt: skip
        return buckets


@dataclass(frozen=True, slots=True)
class QueueSeries:
    """The per-job series of one queue."""

    leased: Tally
    wait: Distribution
    in_flight: Tally


@dataclass(frozen=True, slots=True)
class JobSeries:
    """The per-job series of one queue and type."""

    duration: Distribution
    finished: dict[str, Tally]  # outcome -> its counter


@dataclass(frozen=True, slots=True)
class ScheduleSeries:
    """The series of one schedule (prometheus_client's children: a schedule fires seldom)."""

    fires: Counter
    skipped: Counter
    lateness: Histogram
    last_fire: Gauge
    next_fire: Gauge


S = TypeVar("S", Tally, Distribution)


class JobFlow(Collector):
    """The per-job series, by label values (queue; queue and type; queue, type and outcome)."""

    def __init__(self) -> None:
        self.leased: dict[tuple[str, ...], Tally] = {}
        self.wait: dict[tuple[str, ...], Distribution] = {}
        self.in_flight: dict[tuple[str, ...], Tally] = {}
        self.duration: dict[tuple[str, ...], Distribution] = {}
        self.finished: dict[tuple[str, ...], Tally] = {}

    def queue(self, queue: str) -> QueueSeries:
        key = (queue,)
        return QueueSeries(
            _series(self.leased, key, Tally),
            _series(self.wait, key, lambda: Distribution(WAIT_BUCKETS)),
            _series(self.in_flight, key, Tally),
        )

    def job(self, queue: str, job_type: str) -> JobSeries:
        finished = {outcome: _series(self.finished, (queue, job_type, outcome), Tally) for outcome in OUTCOMES}
        return JobSeries(_series(self.duration, (queue, job_type), lambda: Distribution(DURATION_BUCKETS)), finished)

    def collect(self) -> Iterator[Metric]:
        leased = CounterMetricFamily("jobcar_jobs_leased", "Jobs leased from Redis to run.", labels=["queue"])
        for labels, tally in self.leased.items():
            leased.add_metric(labels, tally.value)
        yield leased
        finished = CounterMetricFamily(
            "jobcar_jobs_finished", "Attempts by how they were recorded in Redis.", labels=["queue", "type", "outcome"]
        )
        for labels, tally in self.finished.items():
            finished.add_metric(labels, tally.value)
        yield finished
        yield _histogram("jobcar_job_duration_seconds", "Time a handler took for one attempt.", ["queue", "type"],
                         self.duration)  # fmt: skip
        yield _histogram("jobcar_job_wait_seconds", "Time from enqueue (or run-at) until the attempt was leased.",
                         ["queue"], self.wait)  # fmt: skip
        in_flight = GaugeMetricFamily("jobcar_jobs_in_flight", "Jobs this daemon is running now.", labels=["queue"])
        for labels, tally in self.in_flight.items():
            in_flight.add_metric(labels, tally.value)
        yield in_flight


def _series(series: dict[tuple[str, ...], S], labels: tuple[str, ...], new: Callable[[], S]) -> S:
    found = series.get(labels)
    if found is None:
        found = series[labels] = new()
    return found


def _histogram(name: str, documentation: str, label_names: list[str],
               series: dict[tuple[str, ...], Distribution]) -> HistogramMetricFamily:  # fmt: skip
    family = HistogramMetricFamily(name, documentation, labels=label_names)
    for labels, distribution in series.items():
        family.add_metric(labels, distribution.cumulative(), distribution.sum)
    return family


class Metrics:
    def __init__(self, config: Config) -> None:
        # Off for prometheus_client's own counters and histograms below (see the module's docstring); the
        # setting is process-wide, read at each scrape, and this process exports no other registry.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
        self.registry = CollectorRegistry()
        r = self.registry
        self.flow = JobFlow()
        r.register(self.flow)
        self.leases_renewed = Counter("jobcar_leases_renewed", "Leases renewed by heartbeats.", ["queue"], registry=r)
        self.leases_lost = Counter(
            "jobcar_leases_lost", "Attempts abandoned because their lease was lost or could not be renewed.",
            ["queue"], registry=r,
        )  # fmt: skip
        self.leases_reaped = Counter(
            "jobcar_leases_reaped", "Expired leases recovered by this daemon's reaper, by where the job went.",
            ["queue", "to"], registry=r,
        )  # fmt: skip
        self.jobs_expired = Counter(
            "jobcar_jobs_expired", "Jobs not started by their deadline: moved to the dead-letter queue by a lease.",
            ["queue"], registry=r,
        )  # fmt: skip
        self.schedule_fires = Counter(
            "jobcar_schedule_fires", "Ticks of a schedule this daemon fired (made the tick's job).", ["schedule"],
            registry=r,
        )  # fmt: skip
        self.schedule_skips = Counter(
            "jobcar_schedule_skips", "Ticks this daemon passed over: missed (catchup) or overlapping a running job.",
            ["schedule"], registry=r,
        )  # fmt: skip
        self.batch_sizes = Histogram(
            "jobcar_batch_size", "Jobs in each call to a batched handler.", ["queue", "type"], buckets=BATCH_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.schedule_lateness = Histogram(
            "jobcar_schedule_lateness_seconds", "From a tick (Redis time) to its job being made.", ["schedule"],
            buckets=LATENESS_BUCKETS, registry=r,
        )  # fmt: skip
        self.schedule_last_fire = Gauge(
            "jobcar_schedule_last_fire_timestamp_seconds", "The last tick this daemon fired.", ["schedule"], registry=r
        )
        self.schedule_next_fire = Gauge(
            "jobcar_schedule_next_fire_timestamp_seconds", "The tick the schedule waits at, as this daemon saw it.",
            ["schedule"], registry=r,
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
        self.queue_max_pending = Gauge(
            "jobcar_queue_max_pending", "The backpressure bound of the queue's pending and held jobs (absent: none).",
            ["queue"], registry=r,
        )  # fmt: skip
        self.type_max_pending = Gauge(
            "jobcar_type_max_pending",
            "The backpressure bound of a type's pending and held jobs in the queue (absent: none).",
            ["queue", "type"], registry=r,
        )  # fmt: skip
        self.type_pending = Gauge(
            "jobcar_type_pending_jobs",
            "A bounded type's jobs pending or held in the queue, the count its bound holds.",
            ["queue", "type"], registry=r,
        )  # fmt: skip
        self.queue_refused = Gauge(
            "jobcar_queue_refused_jobs", "Jobs an enqueue refused by a max_pending, ever, by every producer (a count).",
            ["queue"], registry=r,
        )  # fmt: skip
        self.jobs_held = Gauge(
            "jobcar_jobs_held", "Jobs a fleet-wide limit holds now (over a concurrency limit or a rate).",
            ["queue", "type"], registry=r,
        )  # fmt: skip
        self.held_seconds = Histogram(
            "jobcar_job_held_seconds", "How long fleet-wide limits held a job, from its first hold to its lease.",
            ["queue", "type"], buckets=WAIT_BUCKETS, registry=r,
        )  # fmt: skip
        build = Gauge("jobcar_build_info", "jobcar's version.", ["version", "python"], registry=r)
        build.labels(__version__, platform.python_version()).set(1)
        self._stats_at = 0.0
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Bound the labels to the config's queues and types and create their label sets at 0."""
        self.queues = frozenset(config.queues)
        self.types = frozenset(config.handlers)
        self._queue_series: dict[str, QueueSeries] = {}
        self._job_series: dict[tuple[str, str], JobSeries] = {}
        queues = [*self.queues, OTHER]
        types = [*self.types, OTHER]
        for q in queues:
            self.flow.queue(q)
            self.leases_renewed.labels(q)
            self.leases_lost.labels(q)
            self.jobs_expired.labels(q)
            for to in ("pending", "dead"):
                self.leases_reaped.labels(q, to)
            for t in types:
                self.flow.job(q, t)
        for q in self.queues:
            for state in GAUGED_STATES:
                self.queue_jobs.labels(q, state.value)
            self.queue_latency.labels(q)
            self.queue_paused.labels(q)
            for t in self.types:
                if config.handlers[t].limits is not None:
                    self.jobs_held.labels(q, t)
        for result in ("ok", "failed"):
            self.reloads.labels(result)

    def schedule(self, name: str) -> ScheduleSeries:
        return ScheduleSeries(
            self.schedule_fires.labels(name), self.schedule_skips.labels(name), self.schedule_lateness.labels(name),
            self.schedule_last_fire.labels(name), self.schedule_next_fire.labels(name),
        )  # fmt: skip

    def queue(self, name: str) -> str:
        return name if name in self.queues else OTHER

    def type(self, name: str) -> str:
        return name if name in self.types else OTHER

    def of_queue(self, queue: str) -> QueueSeries:
        series = self._queue_series.get(queue)
        if series is None:
            series = self._queue_series[queue] = self.flow.queue(self.queue(queue))
        return series

    def of_job(self, queue: str, job_type: str) -> JobSeries:
        series = self._job_series.get((queue, job_type))
        if series is None:
            series = self._job_series[(queue, job_type)] = self.flow.job(self.queue(queue), self.type(job_type))
        return series

    def of_held(self, queue: str, job_type: str) -> Histogram:
        """The held-time histogram of a queue and type (children of prometheus_client's: a held job is the
        exception, not every job)."""
        return self.held_seconds.labels(self.queue(queue), self.type(job_type))

    async def render(
        self, client: transport.AsyncRedis, queues: Iterable[keys.QueueKeys], *, openmetrics: bool = False
    ) -> bytes:
        """The exposition, with queue depths refreshed from Redis at most once a second; `openmetrics`: in that
        format, whose histograms carry their exemplars (the Prometheus text format has none)."""
        if time.monotonic() - self._stats_at > STATS_CACHE_SECONDS:
            keys = list(queues)
            replies = await transport.execute_async(client, [transitions.stats_call(k) for k in keys])
            for k, reply in zip(keys, replies, strict=True):
                stats = transitions.parse_stats(k, reply)
                for state in GAUGED_STATES:
                    self.queue_jobs.labels(k.queue, state.value).set(getattr(stats, state.value))
                self.queue_latency.labels(k.queue).set(stats.latency_s)
                self.queue_paused.labels(k.queue).set(1 if stats.paused else 0)
                self.queue_refused.labels(k.queue).set(stats.refused)
                if stats.max_pending is not None:
                    self.queue_max_pending.labels(k.queue).set(stats.max_pending)
                else:
                    with contextlib.suppress(KeyError):  # a bound lifted: its series goes
                        self.queue_max_pending.remove(k.queue)
                self._set_type_bounds(k.queue, stats)
                self._set_held(k.queue, stats.held_by_type)
            self._stats_at = time.monotonic()
        if openmetrics:
            return bytes(generate_openmetrics(self.registry))  # type: ignore[no-untyped-call]
        return generate_latest(self.registry)

    def _set_type_bounds(self, queue: str, stats: transitions.QueueStats) -> None:
        """The bounded types' bounds and counts; a bound lifted, its two series go. Only the config's types:
        bounds of several types do not add up under `other`."""
        bounds = {t: n for t, n in stats.max_pending_by_type.items() if t in self.types}
        seen = {sample.labels["type"] for family in self.type_max_pending.collect() for sample in family.samples
                if sample.labels["queue"] == queue}  # fmt: skip
        for job_type in seen - bounds.keys():
            self.type_max_pending.remove(queue, job_type)
            with contextlib.suppress(KeyError):
                self.type_pending.remove(queue, job_type)
        for job_type, bound in bounds.items():
            self.type_max_pending.labels(queue, job_type).set(bound)
            self.type_pending.labels(queue, job_type).set(stats.pending_counts.get(job_type, 0))

    def _set_held(self, queue: str, by_type: Mapping[str, int]) -> None:
        """Held jobs by type: configured types by name, any other under `other`; a type none are held of, 0."""
        counts: dict[str, int] = {}
        for job_type, n in by_type.items():
            label = self.type(job_type)
            counts[label] = counts.get(label, 0) + n
        seen = [sample.labels for family in self.jobs_held.collect() for sample in family.samples]
        for labels in seen:  # a type held before and none now: back to 0
            if labels["queue"] == queue and labels["type"] not in counts:
                self.jobs_held.labels(queue, labels["type"]).set(0)
        for label, n in counts.items():
            self.jobs_held.labels(queue, label).set(n)
