"""The per-job series are plain numbers rendered by jobcar's own collector (metrics.JobFlow); what a
scrape reads of them must be what prometheus_client's own Counter, Histogram and Gauge would give."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jobcar.config import parse_config
from jobcar.metrics import DURATION_BUCKETS, OUTCOMES, WAIT_BUCKETS, Metrics

CONFIG = parse_config(
    "redis: {url: 'redis://127.0.0.1:6379'}\nqueues: {default: 1, bulk: 1}\n"
    "handlers:\n  a: {url: 'http://127.0.0.1:1/'}\n  b: {command: [/bin/true]}\n",
    "test.yaml",
    {},
)

SECONDS = st.one_of(
    st.sampled_from([*DURATION_BUCKETS, *WAIT_BUCKETS, 0.0]),  # on a bound: le is inclusive
    st.floats(min_value=0, max_value=100_000, allow_nan=False),
)
#: (queue, type, outcome, duration, wait): one finished attempt; "x" is a name the config does not have.
ATTEMPTS = st.lists(
    st.tuples(
        st.sampled_from(["default", "bulk", "x"]),
        st.sampled_from(["a", "b", "x"]),
        st.sampled_from(OUTCOMES),
        SECONDS,
        SECONDS,
    ),
    max_size=30,
)


def reference_exposition(attempts: list[tuple[str, str, str, float, float]], running: int) -> str:
    """The same observations through prometheus_client's own types."""
    r = CollectorRegistry()
    leased = Counter("jobcar_jobs_leased", "Jobs leased from Redis to run.", ["queue"], registry=r)
    finished = Counter("jobcar_jobs_finished", "Attempts by how they were recorded in Redis.",
                       ["queue", "type", "outcome"], registry=r)  # fmt: skip
    duration = Histogram("jobcar_job_duration_seconds", "Time a handler took for one attempt.", ["queue", "type"],
                         buckets=DURATION_BUCKETS, registry=r)  # fmt: skip
    wait = Histogram("jobcar_job_wait_seconds", "Time from enqueue (or run-at) until the attempt was leased.",
                     ["queue"], buckets=WAIT_BUCKETS, registry=r)  # fmt: skip
    in_flight = Gauge("jobcar_jobs_in_flight", "Jobs this daemon is running now.", ["queue"], registry=r)
    for q in ("default", "bulk", "other"):  # created at 0 for every label set the config implies, in its order
        leased.labels(q)
        wait.labels(q)
        in_flight.labels(q)
        for t in ("a", "b", "other"):
            duration.labels(q, t)
            for outcome in OUTCOMES:
                finished.labels(q, t, outcome)
    for queue, job_type, outcome, seconds, waited in attempts:
        q, t = (queue if queue != "x" else "other"), (job_type if job_type != "x" else "other")
        leased.labels(q).inc()
        wait.labels(q).observe(waited)
        duration.labels(q, t).observe(seconds)
        finished.labels(q, t, outcome).inc()
    in_flight.labels("default").inc(running)
    return generate_latest(r).decode()


@given(ATTEMPTS, st.integers(min_value=0, max_value=5))
def test_the_per_job_series_render_as_prometheus_clients_own(
    attempts: list[tuple[str, str, str, float, float]], running: int
) -> None:
    metrics = Metrics(CONFIG)
    for queue, job_type, outcome, seconds, waited in attempts:
        series = metrics.of_queue(queue)
        series.leased.inc()
        series.wait.observe(waited)
        job = metrics.of_job(queue, job_type)
        job.duration.observe(seconds)
        job.finished[outcome].inc()
    for _ in range(running + 2):
        metrics.of_queue("default").in_flight.inc()
    for _ in range(2):
        metrics.of_queue("default").in_flight.dec()
    ours = [line for line in lines(generate_latest(metrics.registry).decode()) if FLOW.match(line)]
    # Label sets appear in the order they were created (the config's queues come from a set): compare as sets.
    assert sorted(ours) == sorted(lines(reference_exposition(attempts, running)))


FLOW = re.compile(r"(# \w+ )?jobcar_(jobs_leased|jobs_finished|job_wait|job_duration|jobs_in_flight)")


def lines(exposition: str) -> list[str]:
    return exposition.splitlines()


def test_no_series_says_when_it_was_created() -> None:
    """prometheus_client's default adds a `*_created` series per counter and histogram label set; the daemon
    turns them off, for its own collector and prometheus_client's types alike, each with samples here."""
    metrics = Metrics(CONFIG)
    metrics.of_queue("default").leased.inc()
    metrics.of_queue("default").wait.observe(0.2)
    metrics.of_job("default", "a").duration.observe(1.5)
    metrics.of_job("default", "a").finished["done"].inc()
    metrics.leases_renewed.labels("default").inc()
    metrics.batch_sizes.labels("default", "a").observe(3)
    metrics.of_held("default", "a").observe(2)
    schedule = metrics.schedule("nightly")
    schedule.fires.inc()
    schedule.lateness.observe(0.01)
    metrics.redis_errors.inc()
    exposition = generate_latest(metrics.registry).decode()
    for family in ("jobcar_jobs_leased_total", "jobcar_job_duration_seconds_count", "jobcar_leases_renewed_total",
                   "jobcar_batch_size_count", "jobcar_job_held_seconds_count", "jobcar_schedule_fires_total",
                   "jobcar_schedule_lateness_seconds_count", "jobcar_redis_errors_total"):  # fmt: skip
        assert f"\n{family}" in exposition, f"{family} is not in the exposition: the test reads nothing"
    assert [line for line in lines(exposition) if "_created" in line] == []


def test_held_jobs_by_type_go_back_to_zero_and_unknown_types_count_as_other() -> None:
    metrics = Metrics(CONFIG)
    metrics._set_held("default", {"a": 3, "x": 2, "y": 1})
    metrics._set_held("bulk", {"a": 7})
    held = {(s.labels["queue"], s.labels["type"]): s.value for f in metrics.jobs_held.collect() for s in f.samples}
    assert held == {("default", "a"): 3, ("default", "other"): 3, ("bulk", "a"): 7}
    metrics._set_held("default", {})
    held = {(s.labels["queue"], s.labels["type"]): s.value for f in metrics.jobs_held.collect() for s in f.samples}
    assert held == {("default", "a"): 0, ("default", "other"): 0, ("bulk", "a"): 7}, "only the queue read"


def test_a_traced_observation_is_its_buckets_exemplar_in_the_openmetrics_exposition_only() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    metrics = Metrics(CONFIG)
    series = metrics.of_job("default", "a").duration
    series.observe(0.02)  # tracing off: no exemplar, none kept
    assert series.exemplars is None
    trace = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
    series.observe(0.3, trace)
    openmetrics = generate_openmetrics(metrics.registry).decode()
    [line] = [line for line in openmetrics.splitlines() if " # {" in line]
    assert line.startswith('jobcar_job_duration_seconds_bucket{le="0.5",queue="default",type="a"} 2.0 # {')
    assert 'trace_id="4bf92f3577b34da6a3ce929d0e0e4736"' in line
    assert " # {" not in generate_latest(metrics.registry).decode()
