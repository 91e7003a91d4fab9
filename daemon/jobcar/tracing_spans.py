"""The daemon's spans, as `tracing_otel.Tracer` records them, and their way out: a `Span` is a few plain fields
(`Fixed` the attributes many spans share), encoded as OTLP protobuf by hand (an ExportTraceServiceRequest of
the daemon's ended spans) and POSTed to `<endpoint>/v1/traces` in batches by a thread of its own (`Exporter`).
What a span may say of an error or a URL is cut here too (`span_reason`, `safe_url`). No OpenTelemetry package
is needed for them (ADR 0025). Loaded by `tracing_otel.py` only (others name `Span` for typing alone).
"""

from __future__ import annotations

import logging
import os
import random
import struct
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit, urlunsplit

from jobcar import __version__

if TYPE_CHECKING:
    from jobcar.config_types import TracingSettings

log = logging.getLogger("jobcar.tracing")

#: OTLP's span kinds and status codes.
INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER = 1, 2, 3, 4, 5
STATUS_ERROR: Final = 2
#: Spans waiting for the exporter at most; past it new ones are dropped and counted (a collector away for long).
MAX_QUEUE: Final = 16384
#: Spans per export request.
BATCH: Final = 2048


def parse_traceparent(traceparent: str | None) -> tuple[bytes, bytes, bool] | None:
    """A W3C `traceparent` as (trace id, span id, sampled), or None when it is not a valid one."""
    if not traceparent or len(traceparent) < 55 or traceparent[:3] != "00-":
        return None
    try:
        trace_id, span_id = bytes.fromhex(traceparent[3:35]), bytes.fromhex(traceparent[36:52])
        sampled = bool(int(traceparent[53:55], 16) & 1)
    except ValueError:
        return None
    if trace_id == bytes(16) or span_id == bytes(8):
        return None
    return trace_id, span_id, sampled


class Fixed:
    """Attributes that many spans share (an attempt's queue, type and attempt number; a handler call's), made
    once by the event loop and encoded once by the exporter, which keeps the encoding here."""

    __slots__ = ("attributes", "encoded")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        self.encoded: bytes | None = None


_NO_FIXED: Final = Fixed({})


class Span:
    """One span of the daemon, as recorded: plain fields, no lock (the daemon's event loop makes and ends it),
    handed whole to the exporter when it ends. An unsampled one only carries its ids, to pass them on.
    `fixed` holds the attributes it shares with others, `attributes` its own."""

    __slots__ = ("attributes", "end", "events", "fixed", "kind", "links", "name", "parent_id", "sampled",
                 "span_id", "start", "status", "trace_id")  # fmt: skip

    def __init__(self, trace_id: bytes, parent_id: bytes, sampled: bool, name: str, kind: int,
                 attributes: dict[str, Any], start: int) -> None:  # fmt: skip
        self.trace_id = trace_id
        self.span_id = (random.getrandbits(64) or 1).to_bytes(8, "big")  # all zeros is no span id
        self.parent_id = parent_id
        self.sampled = sampled
        self.name = name
        self.kind = kind
        self.attributes = attributes
        self.start = start
        self.end = 0
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self.links: list[tuple[bytes, bytes]] = []
        self.status: tuple[int, str] | None = None
        self.fixed = _NO_FIXED

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id.hex()}-{self.span_id.hex()}-{'01' if self.sampled else '00'}"

    def add_event(self, name: str, attributes: dict[str, Any], timestamp: int | None = None) -> None:
        if self.sampled:
            self.events.append((name, timestamp or time.time_ns(), attributes))

    def error(self, message: str) -> None:
        self.status = (STATUS_ERROR, message)


# -- OTLP protobuf, by hand ------------------------------------------------------------------------------

_pack_q: Final = struct.Struct("<Q").pack
_pack_d: Final = struct.Struct("<d").pack


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, its length, its bytes."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


def _any(value: Any) -> bytes:
    """An AnyValue: string (1), bool (2), int (3), double (4) or an array of strings (5)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    return _field(b"\x2a", b"".join(_field(b"\x0a", _field(b"\x0a", str(v).encode())) for v in value))


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any(value))


def _attribute(tag: bytes, key: str, value: Any) -> bytes:
    """A KeyValue as the field `tag` of its message (a span's attributes, an event's). Those that come again and
    again (the queue, the type, an outcome, an attempt number) are encoded once: the cache holds strings and
    ints but a job's id, and starts over past 4096 entries."""
    cacheable = key != "messaging.message.id" and type(value) in (str, int, bool)
    if cacheable:
        found = _encoded.get((tag, key, value))
        if found is not None:
            return found
    encoded = _field(tag, _key_value(key, value))
    if cacheable:
        if len(_encoded) >= 4096:
            _encoded.clear()
        _encoded[(tag, key, value)] = encoded
    return encoded


#: (tag, key, value) -> its encoding (`_attribute`); used by the exporter's thread only.
_encoded: dict[tuple[bytes, str, Any], bytes] = {}
#: (tag, text) -> its field: span and event names, a handful (a queue's, a type's) made again and again.
_texts: dict[tuple[bytes, str], bytes] = {}


def _text(tag: bytes, text: str) -> bytes:
    found = _texts.get((tag, text))
    if found is None:
        if len(_texts) >= 4096:
            _texts.clear()
        found = _texts[(tag, text)] = _field(tag, text.encode())
    return found


def _encode_span(span: Span) -> bytes:
    name = _text(b"\x2a", span.name)
    out = [b"\x0a\x10", span.trace_id, b"\x12\x08", span.span_id]
    if span.parent_id:
        out += (b"\x22\x08", span.parent_id)
    out += (name, b"\x30", bytes((span.kind,)), b"\x39", _pack_q(span.start), b"\x41", _pack_q(span.end))
    fixed = span.fixed
    if fixed.encoded is None:  # a race with another exporter only encodes it twice, the same
        fixed.encoded = b"".join(_attribute(b"\x4a", k, v) for k, v in fixed.attributes.items())
    out.append(fixed.encoded)
    out += [_attribute(b"\x4a", k, v) for k, v in span.attributes.items()]
    for event_name, at, attributes in span.events:
        event = b"\x09" + _pack_q(at) + _text(b"\x12", event_name)
        event += b"".join(_attribute(b"\x1a", k, v) for k, v in attributes.items())
        out.append(_field(b"\x5a", event))
    out += [_field(b"\x6a", b"\x0a\x10" + trace_id + b"\x12\x08" + span_id) for trace_id, span_id in span.links]
    if span.status is not None:
        code, message = span.status
        out.append(_field(b"\x7a", _field(b"\x12", message.encode()) + b"\x18" + bytes((code,))))
    return b"".join(out)


def _resource(settings: TracingSettings) -> bytes:
    """The Resource message: service.name and version, and OTEL_RESOURCE_ATTRIBUTES (`k=v,k=v`)."""
    attributes = {"telemetry.sdk.name": "jobcar", "telemetry.sdk.language": "python"}
    for pair in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() and value:
            attributes[key.strip()] = unquote(value.strip())
    attributes |= {"service.name": settings.service_name, "service.version": __version__}
    return b"".join(_field(b"\x0a", _key_value(k, v)) for k, v in attributes.items())


def _encode_spans(resource: bytes, spans: Sequence[Span]) -> bytes:
    """An ExportTraceServiceRequest: one ResourceSpans (the daemon) of one ScopeSpans (jobcar) of `spans`."""
    scope = _field(b"\x0a", _field(b"\x0a", b"jobcar") + _field(b"\x12", __version__.encode()))
    scope_spans = scope + b"".join(_field(b"\x12", _encode_span(span)) for span in spans)
    return _field(b"\x0a", _field(b"\x0a", resource) + _field(b"\x12", scope_spans))


class Exporter:
    """Ended spans, queued by the event loop (a deque append) and sent by a thread of its own: every
    OTEL_BSP_SCHEDULE_DELAY ms (5000, as OpenTelemetry's batch processor), or as soon as a batch is full. A
    failed request is logged (at most once a minute) and its spans dropped: a trace is not worth the memory of
    an outage."""

    def __init__(self, settings: TracingSettings) -> None:
        self._url = settings.endpoint.rstrip("/") + "/v1/traces"
        self._headers = {**settings.headers, "Content-Type": "application/x-protobuf"}
        self._resource = _resource(settings)
        self._delay = float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000")) / 1000
        self._spans: deque[Span] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self.dropped = 0
        self._complained_at = 0.0
        self._thread = threading.Thread(target=self._run, name="jobcar span exporter", daemon=True)
        self._thread.start()

    def add(self, span: Span) -> None:
        if len(self._spans) >= MAX_QUEUE:
            self.dropped += 1
            return
        self._spans.append(span)
        if len(self._spans) == BATCH:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            stopping = self._stopping  # read before the flush: what ended before the stop goes out with it
            self._flush()
            if stopping:
                return

    def _flush(self) -> None:
        while self._spans:
            batch = [self._spans.popleft() for _ in range(min(BATCH, len(self._spans)))]
            body = _encode_spans(self._resource, batch)
            try:
                request = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
            except OSError as exc:  # refused, reset, timed out, an HTTP error status (HTTPError is one)
                if time.monotonic() - self._complained_at > 60:
                    self._complained_at = time.monotonic()
                    log.warning("could not export %d spans to %s: %s", len(batch), self._url, exc)

    def shutdown(self) -> None:
        """The spans still queued go out, for at most 10 s: a collector that hangs must not hold up the exit."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)
        if self.dropped:
            log.warning("%d spans were dropped: more than %d waited for the exporter", self.dropped, MAX_QUEUE)


#: An error text on a span is cut to this (the job's error history keeps the whole of it).
_MAX_REASON: Final = 300


def span_reason(error: str | None) -> str:
    """An error as a span says it: cut to _MAX_REASON."""
    text = error or "no reason given"
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def safe_url(url: str) -> str:
    """A handler's URL without credentials (`http://user:password@host/` is allowed in the config); made once per
    URL (a handful: the config's)."""
    safe = _safe_urls.get(url)
    if safe is None:
        parts = urlsplit(url)
        safe = _safe_urls[url] = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    return safe


_safe_urls: dict[str, str] = {}
