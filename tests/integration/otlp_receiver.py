"""A real OTLP/HTTP receiver for the tracing tests: an HTTP server on loopback that takes what OpenTelemetry's
exporters POST to `/v1/traces` and `/v1/metrics` (protobuf), decodes it with `opentelemetry-proto`, and keeps
every span and metric point it received, flattened for assertions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

KINDS = {
    ProtoSpan.SPAN_KIND_INTERNAL: "internal",
    ProtoSpan.SPAN_KIND_SERVER: "server",
    ProtoSpan.SPAN_KIND_CLIENT: "client",
    ProtoSpan.SPAN_KIND_PRODUCER: "producer",
    ProtoSpan.SPAN_KIND_CONSUMER: "consumer",
}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any], int]]
    links: list[tuple[str, str]]
    status_code: int
    status_message: str
    start_ns: int
    end_ns: int

    @property
    def traceparent_ids(self) -> tuple[str, str]:
        return self.trace_id, self.span_id

    def event(self, name: str) -> dict[str, Any] | None:
        return next((attributes for event, attributes, _ in self.events if event == name), None)


@dataclass
class OtlpReceiver:
    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    #: (service, metric name, kind, point attributes, value or (count, sum)) of every point received.
    points: list[tuple[str, str, str, dict[str, Any], Any]] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_traces(self, body: bytes) -> bytes:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received = ReceivedSpan(
                        service=service,
                        name=span.name,
                        kind=KINDS.get(span.kind, "unspecified"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes), e.time_unix_nano) for e in span.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        status_code=span.status.code,
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                    with self.lock:
                        self.spans.append(received)
        return bytes(ExportTraceServiceResponse().SerializeToString())

    def take_metrics(self, body: bytes) -> bytes:
        request = ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in request.resource_metrics:
            service = str(_attributes(resource_metrics.resource.attributes).get("service.name", ""))
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    if kind is None:
                        raise ValueError(f"metric {metric.name} has no data")
                    data = getattr(metric, kind)
                    for point in data.data_points:
                        if kind == "histogram":
                            value: Any = (point.count, point.sum)
                        else:
                            value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                        with self.lock:
                            self.points.append((service, metric.name, kind, _attributes(point.attributes), value))
        return bytes(ExportMetricsServiceResponse().SerializeToString())

    def named(self, name: str, **attributes: Any) -> list[ReceivedSpan]:
        with self.lock:
            spans = list(self.spans)
        return [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())]

    def by_id(self, span_id: str) -> ReceivedSpan:
        with self.lock:
            return next(s for s in self.spans if s.span_id == span_id)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.requests.append((self.path, dict(self.headers.items())))
            if self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(415)
                return
            if self.path == "/v1/traces":
                answer = receiver.take_traces(body)
            elif self.path == "/v1/metrics":
                answer = receiver.take_metrics(body)
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
