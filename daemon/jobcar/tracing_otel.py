"""The tracer behind `tracing.py`: jobcar's spans, made with OpenTelemetry and exported over OTLP/HTTP.

The only module that imports OpenTelemetry, and only `tracing.py` imports it (when tracing is on, or in an
app that uses OpenTelemetry). Spans follow the messaging conventions: `messaging.system` is `jobcar`, the
destination is the queue, the message id the job id. A producer span per enqueue call (its context is the
traceparent each job carries unless the job brought its own); a consumer span per attempt, a child of that
context, with the attempt's events; a client span per handler call, whose context the handler gets as
`traceparent` / `TRACEPARENT`, so a handler in any language continues the trace.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from jobcar import __version__

if TYPE_CHECKING:
    from jobcar.config_types import Handler, TracingSettings
    from jobcar.enqueueing import EnqueueRecord
    from jobcar.job import Job, JobInfo
    from jobcar.outcome import Outcome

__all__ = ["MetricsPusher", "Tracer", "format_traceparent", "parse_traceparent"]

SYSTEM: Final = "jobcar"
#: An error text on a span is cut to this (the job's error history keeps the whole of it).
_MAX_REASON: Final = 300


def parse_traceparent(traceparent: str | None) -> SpanContext | None:
    """A W3C `traceparent` as a remote span context, or None when it is not a valid one."""
    if not traceparent or len(traceparent) < 55 or traceparent[:3] != "00-":
        return None
    try:
        context = SpanContext(
            trace_id=int(traceparent[3:35], 16),
            span_id=int(traceparent[36:52], 16),
            is_remote=True,
            trace_flags=TraceFlags(int(traceparent[53:55], 16)),
        )
    except ValueError:
        return None
    return context if context.is_valid else None


def format_traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags) & 0xFF:02x}"


def _parent(traceparent: str | None) -> otel_context.Context | None:
    span_context = parse_traceparent(traceparent)
    # An empty Context, not None: None would make the span a child of whatever is current in this task.
    return trace.set_span_in_context(NonRecordingSpan(span_context)) if span_context else otel_context.Context()


def _ns(ms: int) -> int:
    return ms * 1_000_000


def _reason(error: str | None) -> str:
    text = error or "no reason given"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def _safe_url(url: str) -> str:
    """A handler's URL without credentials (`http://user:password@host/` is allowed in the config)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Tracer:
    """Makes jobcar's spans. `exporting` for the daemon (its own provider, exporting over OTLP/HTTP);
    `over_global` for a producer in an app that set up OpenTelemetry itself."""

    def __init__(self, tracer: trace.Tracer, provider: Any = None, settings: TracingSettings | None = None) -> None:
        self._tracer = tracer
        self._provider = provider
        self._settings = settings

    @classmethod
    def exporting(cls, settings: TracingSettings) -> Tracer:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        resource = Resource.create({"service.name": settings.service_name, "service.version": __version__})
        # ParentBased: an attempt whose producer was sampled is recorded, one whose producer was not is not,
        # so a trace is whole or absent; the ratio decides for traces that begin here.
        provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)))
        exporter = OTLPSpanExporter(endpoint=settings.endpoint.rstrip("/") + "/v1/traces", headers=settings.headers)
        # Exported from the processor's own thread, in batches: an attempt only appends its ended spans to a
        # queue. A queue bigger than the SDK's 2048 rides out a burst of short jobs (three spans each) between
        # two exports instead of dropping spans.
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=16384, max_export_batch_size=2048))
        return cls(provider.get_tracer("jobcar", __version__), provider, settings)

    @classmethod
    def over_global(cls) -> Tracer:
        return cls(trace.get_tracer("jobcar", __version__))

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # exports what the batch processor still holds

    def metrics_pusher(self) -> MetricsPusher | None:
        """The pusher of /metrics over OTLP when `tracing.metrics_interval` asks for one."""
        if self._settings is None or not self._settings.metrics_interval:
            return None
        return MetricsPusher(self._settings)

    # -- producers ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def request(self, traceparent: str | None) -> Iterator[None]:
        """Within it, the spans this task starts are children of `traceparent` (an HTTP request's header)."""
        span_context = parse_traceparent(traceparent)
        if span_context is None:
            yield
            return
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(span_context)))
        try:
            yield
        finally:
            otel_context.detach(token)

    def send(self, records: Sequence[EnqueueRecord]) -> Span | None:
        """The producer span of one enqueue call, a child of the current context; each record without a
        traceparent of its own gets the span's. None when every record brought its own (nothing to say)."""
        untraced = [record for record in records if record.traceparent is None]
        if not untraced:
            return None
        queues = {record.queue for record in untraced}
        queue = next(iter(queues)) if len(queues) == 1 else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if queue is not None:
            attributes["messaging.destination.name"] = queue
        if len(untraced) == 1:
            attributes["messaging.message.id"] = untraced[0].id
            attributes["jobcar.job.type"] = untraced[0].type
        else:
            attributes["messaging.batch.message_count"] = len(untraced)
        span = self._tracer.start_span(f"send {queue}" if queue else "send", kind=SpanKind.PRODUCER,
                                       attributes=attributes)  # fmt: skip
        span_context = span.get_span_context()
        if span_context.is_valid:  # the API without an SDK makes invalid ones: then the jobs carry nothing
            traceparent = format_traceparent(span_context)
            for record in untraced:
                # The records were built for this call (records.build_record): setting the field before they
                # are stored is what the producer would have done with a traceparent= option.
                record.traceparent = traceparent
        return span

    def sent(self, span: Span, infos: Sequence[JobInfo]) -> None:
        if len(infos) == 1:
            span.set_attribute("messaging.message.id", infos[0].id)  # an existing job's, for a duplicate
            span.set_attribute("jobcar.enqueue.status", infos[0].status.value)
        span.end()

    def send_failed(self, span: Span, error: BaseException) -> None:
        span.set_status(Status(StatusCode.ERROR, _reason(str(error) or type(error).__name__)))
        span.set_attribute("error.type", type(error).__name__)
        span.end()

    @contextlib.contextmanager
    def partition(self, queue: str, count: int) -> Iterator[None]:
        """One producer span for a Spark partition's jobs (not one per row); its jobs carry its context."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
            "messaging.batch.message_count": count,
        }
        with self._tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes):
            yield

    def schedule_fire(self, queue: str, schedule: str, tick_ms: int) -> Span:
        """The span of one schedule's fire (a new trace: nothing asked for it); the job it enqueues is its child
        through the producer span made inside it (`current`)."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": queue,
            "jobcar.schedule": schedule,
            "jobcar.schedule.tick": tick_ms,
        }
        return self._tracer.start_span(f"fire {schedule}", context=otel_context.Context(), attributes=attributes)

    @contextlib.contextmanager
    def current(self, span: Span) -> Iterator[None]:
        with trace.use_span(span, end_on_exit=True):
            yield

    # -- attempts -----------------------------------------------------------------------------------

    def attempt(self, job: Job) -> Span:
        """The consumer span of one attempt, started now (its lease), a child of the job's traceparent (the
        producer's span). A job that waited for others gets links to them later (`link`)."""
        now = time.time_ns()
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "jobcar.job.type": job.type,
            "jobcar.attempt": job.attempt,
        }
        span = self._tracer.start_span(f"process {job.queue}", context=_parent(job.traceparent),
                                       kind=SpanKind.CONSUMER, attributes=attributes, start_time=now)  # fmt: skip
        if not span.is_recording():
            return span
        if job.after:
            # When it began to wait (its enqueue); the lease event says when the wait was over.
            span.add_event("jobcar.waiting_for_dependencies", {"jobcar.dependencies": list(job.after[:100])},
                           timestamp=_ns(job.created_ms))  # fmt: skip
        if job.held_at_ms:
            span.add_event("jobcar.held_by_limit", {"jobcar.limit": "fleet-wide",
                           "jobcar.held_ms": max(0, now // 1_000_000 - job.held_at_ms)},
                           timestamp=_ns(job.held_at_ms))  # fmt: skip
        span.add_event("jobcar.leased", {"jobcar.queued_ms": max(0, now // 1_000_000 - job.ready_ms)}, timestamp=now)
        return span

    def link(self, span: Span, traceparents: Sequence[str]) -> None:
        """Links to the creation contexts of the jobs the attempt's job waited for."""
        for traceparent in traceparents:
            span_context = parse_traceparent(traceparent)
            if span_context is not None:
                span.add_link(span_context, {"jobcar.link": "dependency"})

    def held_here(self, span: Span, limit: int) -> None:
        """The attempt waits for a slot of its type's `concurrency` in this daemon."""
        span.add_event("jobcar.held_by_limit", {"jobcar.limit": "concurrency", "jobcar.limit.value": limit})

    def handler_call(self, span: Span, job: Job, handler: Handler) -> tuple[Span, str | None]:
        """The client span of the handler call, a child of the attempt's span, and its traceparent (what
        the handler gets; None when the span is not recorded and the job's own should go instead)."""
        url = getattr(handler, "url", None)
        attributes: dict[str, Any] = {"jobcar.job.type": job.type, "jobcar.attempt": job.attempt}
        if url is not None:
            attributes["jobcar.handler"] = "http"
            attributes["http.request.method"] = "POST"
            attributes["url.full"] = _safe_url(url)
        else:
            attributes["jobcar.handler"] = "command"
            attributes["process.executable.name"] = str(getattr(handler, "command", ("",))[0])
        call = self._tracer.start_span(f"handle {job.type}", context=trace.set_span_in_context(span),
                                       kind=SpanKind.CLIENT, attributes=attributes)  # fmt: skip
        call_context = call.get_span_context()
        return call, format_traceparent(call_context) if call_context.is_valid else None

    def handler_stopped(self, call: Span, error: BaseException) -> None:
        """The call ended without an outcome: stopped (a cancel, a lost lease, a drain) or a bug."""
        call.set_status(Status(StatusCode.ERROR, f"stopped: {type(error).__name__}"))
        call.end()

    def handler_returned(self, call: Span, outcome: Outcome) -> None:
        call.set_attribute("jobcar.handler.outcome", outcome.kind.value)
        if outcome.error is not None and outcome.spend_attempt:
            call.set_status(Status(StatusCode.ERROR, _reason(outcome.error)))
        call.end()

    def recorded(self, span: Span, recorded: str, outcome: Outcome, retry_in: float | None) -> None:
        """The attempt's outcome as recorded (`recording.Recorded`), and the span's end."""
        recorded = str(recorded)  # a StrEnum: its value
        span.set_attribute("jobcar.outcome", recorded)
        snoozed = outcome.kind.value == "retry" and not outcome.spend_attempt
        if recorded in ("retried", "returned") and retry_in is not None:
            span.set_attribute("jobcar.retry.delay_s", retry_in)
        if snoozed and recorded == "retried":
            span.add_event("jobcar.snoozed", {"jobcar.snooze.delay_s": retry_in or 0.0,
                                              "jobcar.reason": _reason(outcome.error)})  # fmt: skip
        elif recorded == "dead":
            reason = _reason(outcome.error)
            span.set_attribute("jobcar.dead.reason", reason)
            span.set_status(Status(StatusCode.ERROR, reason))
        elif recorded == "retried":
            span.set_status(Status(StatusCode.ERROR, _reason(outcome.error)))
        span.end()

    def unrecorded(self, span: Span, why: str) -> None:
        span.set_status(Status(StatusCode.ERROR, why))
        span.end()

    # -- exemplars ----------------------------------------------------------------------------------

    @staticmethod
    def exemplar(span: Span) -> dict[str, str] | None:
        """The labels of a Prometheus exemplar pointing at `span`'s trace, or None for a span not recorded."""
        span_context = span.get_span_context()
        if not span_context.is_valid or not span_context.trace_flags.sampled:
            return None
        return {"trace_id": f"{span_context.trace_id:032x}", "span_id": f"{span_context.span_id:016x}"}


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
