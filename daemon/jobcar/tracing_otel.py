"""The tracers behind `tracing.py`: jobcar's spans, exported over OTLP/HTTP, and the metrics push.

Spans follow OpenTelemetry's messaging conventions: `messaging.system` is `jobcar`, the destination is the
queue, the message id the job id. A producer span per enqueue call (its context is the traceparent each job
carries unless the job brought its own); a consumer span per attempt, a child of that context, with the
attempt's events; a client span per handler call, whose context the handler gets as `traceparent` /
`TRACEPARENT`, so a handler in any language continues the trace.

Two tracers. The daemon's, `Tracer`, records its spans itself and encodes them as OTLP protobuf by hand
on an exporter thread (`tracing_spans.py`): OpenTelemetry's SDK spent about 150 µs of the daemon's one core per
job on its two spans before any export (attribute checks, locks, a readable copy of each span), more than a
job costs without tracing (ADR 0025). `AppTracer` makes a producer's spans through the OpenTelemetry API, for
an app that set up OpenTelemetry itself (its provider gets them). The metrics push uses the SDK's OTLP metric
exporter (a few hundred points every interval, off the jobs' path). This is the only module that imports
OpenTelemetry, and only `tracing.py` imports it.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from jobcar import __version__
from jobcar.tracing_spans import (
    CLIENT,
    CONSUMER,
    PRODUCER,
    Exporter,
    Fixed,
    Span,
    parse_traceparent,
    safe_url,
    span_reason,
)

if TYPE_CHECKING:
    from jobcar.config_types import Handler, TracingSettings
    from jobcar.enqueueing import EnqueueRecord
    from jobcar.job import Job, JobInfo
    from jobcar.outcome import Outcome

__all__ = ["AppTracer", "MetricsPusher", "Partition", "ProducerTracer", "Tracer"]

SYSTEM: Final = "jobcar"


def _messaging(operation: str, queue: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    return attributes


#: The context a task's spans are children of (an HTTP request's traceparent, a schedule's fire): trace id, span
#: id, sampled.
_current: ContextVar[tuple[bytes, bytes, bool] | None] = ContextVar("jobcar_trace_context", default=None)


class ProducerTracer(Protocol):
    """What a producer asks of a tracer (producer.py, spark.py): the daemon's or an app's."""

    def send(self, records: Sequence[EnqueueRecord]) -> Any: ...
    def sent(self, span: Any, infos: Sequence[JobInfo]) -> None: ...
    def send_failed(self, span: Any, error: BaseException) -> None: ...
    def partition(self, queue: str) -> contextlib.AbstractContextManager[Partition]: ...


@dataclass(slots=True)
class Partition:
    """A Spark partition's producer span, as its sender sees it: the context its jobs carry, and how many it sent
    (the span's `messaging.batch.message_count` when it ends)."""

    traceparent: str | None
    count: int = 0


def _send_attributes(untraced: Sequence[EnqueueRecord]) -> tuple[str, dict[str, Any]]:
    """The producer span's name and attributes for the records that get its context."""
    queues = {record.queue for record in untraced}
    queue = next(iter(queues)) if len(queues) == 1 else None
    attributes = _messaging("send", queue)
    if len(untraced) == 1:
        attributes["messaging.message.id"] = untraced[0].id
        attributes["jobcar.job.type"] = untraced[0].type
    else:
        attributes["messaging.batch.message_count"] = len(untraced)
    return (f"send {queue}" if queue else "send"), attributes


class Tracer:
    """The daemon's tracer: its spans, sampled (a parent's choice, else `sampling_ratio` of the trace ids), and
    exported over OTLP/HTTP in batches from a thread of their own."""

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        # A trace id is sampled when its low 64 bits are below this (as OpenTelemetry's TraceIdRatioBased does).
        self._bound = round(settings.sampling_ratio * 2**64)
        self._exporter = Exporter(settings)
        #: The Fixed attribute blocks in use, by what makes them: (queue, type, attempt), (handler, attempt).
        self._fixed: dict[tuple[Any, ...], Fixed] = {}

    @classmethod
    def exporting(cls, settings: TracingSettings) -> Tracer:
        return cls(settings)

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def metrics_pusher(self) -> MetricsPusher | None:
        """The pusher of /metrics over OTLP when `tracing.metrics_interval` asks for one."""
        return MetricsPusher(self.settings) if self.settings.metrics_interval else None

    def _start(self, name: str, kind: int, attributes: dict[str, Any], parent: tuple[bytes, bytes, bool] | None,
               start: int | None = None) -> Span:  # fmt: skip
        if parent is not None:
            trace_id, parent_id, sampled = parent
        else:
            trace_id, parent_id = random.getrandbits(128).to_bytes(16, "big"), b""
            sampled = int.from_bytes(trace_id[8:], "big") < self._bound
        return Span(trace_id, parent_id, sampled, name, kind, attributes, start or time.time_ns())

    def _fix(self, key: tuple[Any, ...], attributes: dict[str, Any]) -> Fixed:
        if len(self._fixed) >= 4096:  # types, queues and attempt numbers are few; a flood of new ones starts over
            self._fixed.clear()
        fixed = self._fixed[key] = Fixed(attributes)
        return fixed

    def _end(self, span: Span) -> None:
        if span.sampled:
            span.end = time.time_ns()
            self._exporter.add(span)

    # -- producers ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def request(self, traceparent: str | None) -> Iterator[None]:
        """Within it, the spans this task starts are children of `traceparent` (an HTTP request's header)."""
        token = _current.set(parse_traceparent(traceparent))
        try:
            yield
        finally:
            _current.reset(token)

    def send(self, records: Sequence[EnqueueRecord]) -> Span | None:
        """The producer span of one enqueue call, a child of the current context; each record without a
        traceparent of its own gets the span's. None when every record brought its own (nothing to say)."""
        untraced = [record for record in records if record.traceparent is None]
        if not untraced:
            return None
        name, attributes = _send_attributes(untraced)
        span = self._start(name, PRODUCER, attributes, _current.get())
        traceparent = span.traceparent
        for record in untraced:
            # The records were built for this call (records.build_record): setting the field before they are
            # stored is what the producer would have done with a traceparent= option.
            record.traceparent = traceparent
        return span

    def sent(self, span: Span, infos: Sequence[JobInfo]) -> None:
        if len(infos) == 1:
            span.attributes["messaging.message.id"] = infos[0].id  # an existing job's, for a duplicate
            span.attributes["jobcar.enqueue.status"] = infos[0].status.value
        self._end(span)

    def send_failed(self, span: Span, error: BaseException) -> None:
        span.error(span_reason(str(error) or type(error).__name__))
        span.attributes["error.type"] = type(error).__name__
        self._end(span)

    @contextlib.contextmanager
    def partition(self, queue: str) -> Iterator[Partition]:
        """One producer span for a Spark partition's jobs (not one per row or chunk): its jobs carry its context,
        and it ends with their count."""
        span = self._start(f"send {queue}", PRODUCER, _messaging("send", queue), _current.get())
        sent = Partition(span.traceparent)
        try:
            yield sent
        except BaseException as exc:
            span.error(span_reason(str(exc) or type(exc).__name__))
            raise
        finally:
            span.attributes["messaging.batch.message_count"] = sent.count
            self._end(span)

    def schedule_fire(self, queue: str, schedule: str, tick_ms: int) -> Span:
        """The span of one schedule's fire, the root of a trace (nothing asked for it) and the producer span of
        the job it makes, which carries its context (`schedules.fire_call`)."""
        attributes = {**_messaging("send", queue), "jobcar.schedule": schedule, "jobcar.schedule.tick_ms": tick_ms}
        return self._start(f"fire {schedule}", PRODUCER, attributes, None)

    def schedule_fired(self, span: Span, outcome: str, job_id: str | None) -> None:
        """How the fire went (`schedules.Fired`): a job made (or found made), or nothing done by this daemon (another
        took the tick, or it was not due): then the span is dropped, it tells of nothing that happened."""
        if outcome in ("moved", "early", "paused", "missing"):
            return
        span.attributes["jobcar.schedule.outcome"] = outcome
        if job_id is not None:
            span.attributes["messaging.message.id"] = job_id
        self._end(span)

    # -- attempts -----------------------------------------------------------------------------------

    def attempt(self, job: Job) -> Span:
        """The consumer span of one attempt, started now (its lease), a child of the job's traceparent (the
        producer's span). A job that waited for others gets links to them later (`link`)."""
        now = time.time_ns()
        span = self._start(f"process {job.queue}", CONSUMER, {"messaging.message.id": job.id},
                           parse_traceparent(job.traceparent), now)  # fmt: skip
        if not span.sampled:
            return span
        key = (job.queue, job.type, job.attempt)
        fixed = self._fixed.get(key)
        if fixed is None:
            attributes = {
                **_messaging("process", job.queue),
                "jobcar.job.type": job.type,
                "jobcar.attempt": job.attempt,
            }
            fixed = self._fix(key, attributes)
        span.fixed = fixed
        if job.after:
            # When it began to wait (its enqueue); the lease event says when the wait was over.
            span.add_event("jobcar.waiting_for_dependencies", {"jobcar.dependencies": list(job.after[:100])},
                           job.created_ms * 1_000_000)  # fmt: skip
        if job.held_at_ms:
            held = {"jobcar.limit": "fleet-wide", "jobcar.held_ms": max(0, now // 1_000_000 - job.held_at_ms)}
            span.add_event("jobcar.held_by_limit", held, job.held_at_ms * 1_000_000)
        span.add_event("jobcar.leased", {"jobcar.queued_ms": max(0, now // 1_000_000 - job.ready_ms)}, now)
        return span

    def link(self, span: Span, traceparents: Sequence[str]) -> None:
        """Links to the creation contexts of the jobs the attempt's job waited for."""
        for traceparent in traceparents:
            context = parse_traceparent(traceparent)
            if context is not None and span.sampled:
                span.links.append((context[0], context[1]))

    def held_here(self, span: Span, limit: int) -> None:
        """The attempt waits for a slot of its type's `concurrency` in this daemon."""
        span.add_event("jobcar.held_by_limit", {"jobcar.limit": "concurrency", "jobcar.limit.value": limit})

    def handler_call(self, span: Span, job: Job, handler: Handler) -> tuple[Span, str | None]:
        """The client span of the handler call, a child of the attempt's span, and its traceparent (what the
        handler gets)."""
        call = self._start(f"handle {job.type}", CLIENT, {}, (span.trace_id, span.span_id, span.sampled))
        if not call.sampled:
            return call, call.traceparent
        url = getattr(handler, "url", None)
        target = url if url is not None else str(getattr(handler, "command", ("",))[0])
        key = (job.type, job.attempt, url is not None, target)
        fixed = self._fixed.get(key)
        if fixed is None:
            attributes: dict[str, Any] = {"jobcar.job.type": job.type, "jobcar.attempt": job.attempt}
            if url is not None:
                attributes |= {"jobcar.handler": "http", "http.request.method": "POST", "url.full": safe_url(url)}
            else:
                attributes |= {"jobcar.handler": "command", "process.executable.name": target}
            fixed = self._fix(key, attributes)
        call.fixed = fixed
        return call, call.traceparent

    def handler_stopped(self, call: Span, error: BaseException) -> None:
        """The call ended without an outcome: stopped (a cancel, a lost lease, a drain) or a bug."""
        call.error(f"stopped: {type(error).__name__}")
        self._end(call)

    def handler_returned(self, call: Span, outcome: Outcome) -> None:
        call.attributes["jobcar.handler.outcome"] = outcome.kind.value
        if outcome.error is not None and outcome.spend_attempt:
            call.error(span_reason(outcome.error))
        self._end(call)

    def recorded(self, span: Span, recorded: str, outcome: Outcome, retry_in: float | None) -> None:
        """The attempt's outcome as recorded (`recording.Recorded`), and the span's end."""
        recorded = str(recorded)  # a StrEnum: its value
        span.attributes["jobcar.outcome"] = recorded
        snoozed = outcome.kind.value == "retry" and not outcome.spend_attempt
        if recorded in ("retried", "returned") and retry_in is not None:
            span.attributes["jobcar.retry.delay_s"] = float(retry_in)
        if snoozed and recorded == "retried":
            span.add_event("jobcar.snoozed", {"jobcar.snooze.delay_s": float(retry_in or 0.0),
                                              "jobcar.reason": span_reason(outcome.error)})  # fmt: skip
        elif recorded == "dead":
            reason = span_reason(outcome.error)
            span.attributes["jobcar.dead.reason"] = reason
            span.error(reason)
        elif recorded == "retried":
            span.error(span_reason(outcome.error))
        self._end(span)

    def unrecorded(self, span: Span, why: str) -> None:
        span.error(why)
        self._end(span)

    @staticmethod
    def exemplar(span: Span) -> dict[str, str] | None:
        """The labels of a Prometheus exemplar pointing at `span`'s trace, or None for a span not recorded."""
        return {"trace_id": span.trace_id.hex(), "span_id": span.span_id.hex()} if span.sampled else None


class AppTracer:
    """A producer's spans in an app that set up OpenTelemetry itself, through the API: the app's global
    provider records and exports them (with the API alone, nothing is made and jobs carry no traceparent)."""

    def __init__(self) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("jobcar", __version__)

    @classmethod
    def over_global(cls) -> AppTracer:
        return cls()

    def send(self, records: Sequence[EnqueueRecord]) -> Any:
        untraced = [record for record in records if record.traceparent is None]
        if not untraced:
            return None
        name, attributes = _send_attributes(untraced)
        span = self._tracer.start_span(name, kind=self._trace.SpanKind.PRODUCER, attributes=attributes)
        context = span.get_span_context()
        if context.is_valid:
            traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
            for record in untraced:
                record.traceparent = traceparent
        return span

    def sent(self, span: Any, infos: Sequence[JobInfo]) -> None:
        if len(infos) == 1:
            span.set_attribute("messaging.message.id", infos[0].id)
            span.set_attribute("jobcar.enqueue.status", infos[0].status.value)
        span.end()

    def send_failed(self, span: Any, error: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, span_reason(str(error) or type(error).__name__)))
        span.set_attribute("error.type", type(error).__name__)
        span.end()

    @contextlib.contextmanager
    def partition(self, queue: str) -> Iterator[Partition]:
        with self._tracer.start_as_current_span(f"send {queue}", kind=self._trace.SpanKind.PRODUCER,
                                                attributes=_messaging("send", queue)) as span:  # fmt: skip
            context = span.get_span_context()
            traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
            sent = Partition(traceparent if context.is_valid else None)
            try:
                yield sent
            finally:
                span.set_attribute("messaging.batch.message_count", sent.count)


class MetricsPusher:
    """The metrics of /metrics pushed over OTLP: prometheus_client's registry, collected and translated sample by
    sample (counters to cumulative monotonic sums, gauges to gauges, histograms to explicit-bucket histograms),
    then exported by the SDK's OTLP/HTTP metric exporter to `<endpoint>/v1/metrics` with the spans' headers.
    A translation rather than a second set of instruments: /metrics stays the one source, and a job pays
    nothing more for it."""

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.resources import Resource

        self._exporter = OTLPMetricExporter(
            endpoint=settings.endpoint.rstrip("/") + "/v1/metrics", headers=settings.headers
        )
        self._resource = Resource.create({"service.name": settings.service_name, "service.version": __version__})
        self._started_ns = time.time_ns()

    def push(self, registry: Any) -> bool:
        """Export what `registry` holds now (blocking: run it in a thread); whether the receiver took it."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        return bool(self._exporter.export(self.translate(registry)) is MetricExportResult.SUCCESS)

    def translate(self, registry: Any) -> Any:
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            Gauge,
            Histogram,
            HistogramDataPoint,
            Metric,
            MetricsData,
            NumberDataPoint,
            ResourceMetrics,
            ScopeMetrics,
            Sum,
        )
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        now, start = time.time_ns(), self._started_ns
        cumulative = AggregationTemporality.CUMULATIVE
        metrics = []
        for family in registry.collect():
            data: Any
            if family.type == "histogram":
                by_labels: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
                for sample in family.samples:
                    labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                    point = by_labels.setdefault(labels, {"buckets": [], "count": 0, "sum": 0.0})
                    if sample.name.endswith("_bucket"):
                        point["buckets"].append((float(sample.labels["le"]), sample.value))
                    elif sample.name.endswith("_count"):
                        point["count"] = int(sample.value)
                    elif sample.name.endswith("_sum"):
                        point["sum"] = sample.value
                points = []
                for labels, point in by_labels.items():
                    buckets = sorted(point["buckets"])
                    # Prometheus's buckets are cumulative and end with +Inf; OTLP's are counts per bucket, with the
                    # last one (above every bound) implied by the bounds.
                    counts = [int(v - (buckets[i - 1][1] if i else 0)) for i, (_, v) in enumerate(buckets)]
                    points.append(HistogramDataPoint(dict(labels), start, now, point["count"], point["sum"], counts,
                                                     [b for b, _ in buckets if b != float("inf")], None, None))  # type: ignore[arg-type]  # fmt: skip
                data = Histogram(points, cumulative)
            elif family.type in ("counter", "gauge", "info", "unknown"):
                numbers = [NumberDataPoint(dict(sample.labels), start, now, sample.value) for sample in family.samples
                           if not sample.name.endswith("_created")]  # fmt: skip
                data = Sum(numbers, cumulative, True) if family.type == "counter" else Gauge(numbers)
            else:  # summaries: jobcar has none
                continue
            if not data.data_points:
                continue  # a labelled series with no child yet: nothing to say (OTLP has no empty metric)
            name = family.name + ("_info" if family.type == "info" else "")
            metrics.append(Metric(name, family.documentation, family.unit or None, data))
        scope = ScopeMetrics(InstrumentationScope("jobcar", __version__), metrics, "")
        return MetricsData([ResourceMetrics(self._resource, [scope], "")])

    def shutdown(self) -> None:
        self._exporter.shutdown()
