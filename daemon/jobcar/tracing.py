"""OpenTelemetry traces, behind one small facade that is a no-op while tracing is off.

The rest of jobcar reads `active` (the daemon's tracer, None unless `tracing.enabled`) or calls
`for_producer()`, and calls the tracer only when it is not None: tracing off costs a global read per job
and imports no OpenTelemetry module (tests/unit/test_tracing.py proves it). The tracer itself, the one
module that imports OpenTelemetry, is `tracing_otel.py`, loaded by `setup` when tracing is on (its daemon
tracer needs no OpenTelemetry package; its metrics push does), or by `for_producer` in an app that set up
OpenTelemetry's SDK itself (then the app's global tracer provider gets the client's spans, as any
instrumented library's). ADR 0025 says why it is built so.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from jobcar.errors import JobcarError
from jobcar.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    from jobcar.config_types import TracingSettings
    from jobcar.keys import QueueKeys
    from jobcar.schedules import ScheduleSpec, Step
    from jobcar.scripts import Reply
    from jobcar.tracing_otel import AppTracer, ProducerTracer, Tracer
    from jobcar.tracing_spans import Span

__all__ = [
    "TracingUnavailable",
    "active",
    "for_producer",
    "partition_span",
    "schedule_fires",
    "schedules_fired",
    "setup",
    "shutdown",
    "trace_id_of",
    "trace_link",
]

#: The daemon's tracer while the config's `tracing.enabled`, else None.
active: Tracer | None = None
#: In an app (not the daemon): the tracer over the app's own global provider, made on first use.
_app_tracer: AppTracer | None = None
#: `setup` ran: this process is a daemon, whose config alone decides (its producer spans are its own).
_daemon = False


class TracingUnavailable(JobcarError):
    """`tracing.metrics_interval` without the OpenTelemetry packages (the `otel` extra)."""


def setup(settings: TracingSettings) -> Tracer | None:
    """Start exporting the daemon's spans when `settings.enabled` (else nothing happens, nothing is imported)."""
    global active, _daemon
    _daemon = True
    if not settings.enabled:
        return None
    from jobcar import tracing_otel  # the spans need no package: they are encoded by hand

    if settings.metrics_interval:
        try:  # the metrics push is the SDK's exporter: said at start, not at the first push
            import opentelemetry.exporter.otlp.proto.http.metric_exporter  # noqa: F401
        except ImportError as exc:
            raise TracingUnavailable(
                f"tracing.metrics_interval needs the OpenTelemetry packages: pip install 'jobcar[otel]' ({exc})"
            ) from None
    active = tracing_otel.Tracer.exporting(settings)
    return active


def shutdown() -> None:
    """Export what is still buffered, then stop (the daemon's exit)."""
    global active
    if active is not None:
        active.shutdown()
        active = None


def for_producer() -> ProducerTracer | None:
    """The tracer an enqueue records its producer span with: the daemon's (None while its tracing is off); in
    an app that loaded OpenTelemetry's SDK, one over the app's global tracer provider; else None."""
    global _app_tracer
    if active is not None or _daemon:
        return active
    if _app_tracer is None:
        # The SDK's tracing, not the API's modules: redis-py (7 and later) imports OpenTelemetry's metrics SDK,
        # and with it the trace API, whenever the packages are installed; an app that traces loaded the SDK.
        if "opentelemetry.sdk.trace" not in sys.modules:
            return None
        from jobcar import tracing_otel

        _app_tracer = tracing_otel.AppTracer.over_global()
    return _app_tracer


def schedule_fires(fires: Sequence[tuple[QueueKeys, ScheduleSpec, Step]]) -> list[Span | None]:
    """For the scheduler's round: a span per step that fires a job (the root of its trace), None for the others
    and for every step while tracing is off."""
    if active is None:
        return [None] * len(fires)
    return [active.schedule_fire(keys.queue, spec.name, step.fire_ms) if step.fire_ms is not None else None
            for keys, spec, step in fires]  # fmt: skip


def schedules_fired(spans: Sequence[Span | None], replies: Sequence[Reply]) -> None:
    """Each fire span told how its step went (`schedule_fire`'s reply), and ended or dropped."""
    if active is None:
        return
    from jobcar.schedules import parse_fire

    for span, reply in zip(spans, replies, strict=True):
        if span is not None and not isinstance(reply, Exception):  # a refused call fired nothing: no span
            fired = parse_fire(reply)
            active.schedule_fired(span, fired.outcome, fired.job_id)


_Sent = TypeVar("_Sent")


def partition_span(
    tracer: ProducerTracer, specs: Iterable[Any], send: Callable[[Iterable[Any]], _Sent], count: Callable[[_Sent], int]
) -> _Sent:
    """`send(specs)` inside one producer span for the whole of them (a Spark partition, sent in chunks): each job
    (type, payload, options) that brings no traceparent gets the span's, so no chunk makes a span of its own;
    the span ends with `count(what send returned)` jobs. The queue is the first job's."""
    rows = iter(specs)
    first = next(rows, None)
    if first is None:
        return send(())
    queue = (first[2].get("queue") if len(first) == 3 else None) or DEFAULT_QUEUE
    with tracer.partition(queue) as sent:
        traceparent = sent.traceparent

        def traced(spec: Any) -> Any:
            options = spec[2] if len(spec) == 3 else {}
            if traceparent is None or options.get("traceparent"):
                return spec
            return (spec[0], spec[1], {**options, "traceparent": traceparent})

        result = send(map(traced, itertools.chain((first,), rows)))
        sent.count = count(result)
    return result


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), or None."""
    if not traceparent or len(traceparent) < 35 or traceparent[2] != "-":
        return None
    trace_id = traceparent[3:35].lower()
    # Hex only: it goes into a URL (tracing.trace_url), and a hash written by hand may hold anything.
    if trace_id == "0" * 32 or trace_id.strip("0123456789abcdef"):
        return None
    return trace_id


def trace_link(template: str | None, traceparent: str | None) -> str | None:
    """Where a job's trace is shown (`tracing.trace_url`, its `{trace_id}` replaced), or None without either."""
    trace_id = trace_id_of(traceparent)
    return template.replace("{trace_id}", trace_id) if template and trace_id else None
