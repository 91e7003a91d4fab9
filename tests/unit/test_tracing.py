"""tracing.py's promise: with tracing off, no OpenTelemetry module is ever imported (not by the daemon's modules,
not by a producer's enqueue), and the facade's small pure parts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from jobcar import tracing

ROOT = Path(__file__).resolve().parents[2]

_LOAD_EVERYTHING = textwrap.dedent(
    """\
    import importlib, pkgutil, sys, traceback
    BLOCK = sys.argv[1] == "block"

    class Watch:
        \"\"\"Notes each import of an opentelemetry module made from jobcar's own code; with BLOCK, refuses
        every one (as an install without the packages would) so that nothing else loads them either.\"\"\"
        by_jobcar = []

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] != "opentelemetry":
                return None
            frames = [f.filename for f in traceback.extract_stack()[:-1]]
            if any("/jobcar/" in f and "importlib" not in f for f in frames):
                self.by_jobcar.append(name)
            if BLOCK:
                raise ImportError(name)
            return None

    sys.meta_path.insert(0, Watch())
    import redis  # redis-py 7+ loads OpenTelemetry's metrics SDK by itself where it is installed
    by_redis = {name for name in sys.modules if name.split(".")[0] == "opentelemetry"}
    import jobcar
    # Every module of the package but the one that is OpenTelemetry's (loaded only when tracing is on) and the
    # Spark ones (they need pyspark, and a Spark executor is another process anyway).
    for module in pkgutil.walk_packages(jobcar.__path__, "jobcar."):
        if module.name != "jobcar.tracing_otel" and not module.name.startswith("jobcar.spark"):
            importlib.import_module(module.name)
    from jobcar import tracing
    from jobcar.config import parse_config
    from jobcar.daemon import Daemon
    config = parse_config("handlers: {t: {command: [cat]}}", "jobcar.yaml", {})
    assert not config.tracing.enabled
    Daemon(config)
    assert tracing.setup(config.tracing) is None and tracing.active is None
    assert tracing.for_producer() is None  # what every enqueue asks
    loaded = {name for name in sys.modules if name.split(".")[0] == "opentelemetry"}
    print(sorted(Watch.by_jobcar), sorted(loaded - by_redis), "opentelemetry" in sys.modules)
    """
)


def test_tracing_off_imports_no_opentelemetry_module() -> None:
    """As on an install without the `otel` extra: nothing loads OpenTelemetry, and no jobcar module tries to."""
    result = subprocess.run([sys.executable, "-c", _LOAD_EVERYTHING, "block"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] [] False"


def test_tracing_off_with_the_otel_extra_installed_adds_no_opentelemetry_module() -> None:
    """With the packages installed, redis-py loads OpenTelemetry's metrics SDK on its own (inert until
    configured); jobcar's modules and a daemon with tracing off load nothing more, and never ask for any."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is what this case is about")
    result = subprocess.run([sys.executable, "-c", _LOAD_EVERYTHING, "watch"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    by_jobcar, added, _ = result.stdout.strip().split(" ", 2)
    assert (by_jobcar, added) == ("[]", "[]")


def test_a_producer_in_an_app_that_uses_opentelemetry_gets_a_tracer_over_the_apps_provider() -> None:
    pytest.importorskip("opentelemetry.sdk")
    code = "import opentelemetry.sdk.trace\nfrom jobcar import tracing\nprint(type(tracing.for_producer()).__name__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "AppTracer"


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
        ("garbage", None),
        ('00-4bf92f3577b34da6a3ce929d0e0e47"><-00f067aa0ba902b7-01', None),
        (None, None),
    ],
)
def test_trace_id_of(traceparent: str | None, trace_id: str | None) -> None:
    assert tracing.trace_id_of(traceparent) == trace_id


def test_trace_link() -> None:
    template = "https://ui.honeycomb.io/team/environments/prod/trace?trace_id={trace_id}"
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.trace_link(template, parent) == template.replace("{trace_id}", "4bf92f3577b34da6a3ce929d0e0e4736")
    assert tracing.trace_link(None, parent) is None
    assert tracing.trace_link(template, None) is None
    assert tracing.trace_link(template, "00-not-hex") is None


def test_traceparents_parse() -> None:
    from jobcar import tracing_spans

    parsed = tracing_spans.parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert parsed == (bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736"), bytes.fromhex("00f067aa0ba902b7"), True)
    assert tracing_spans.parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") is not None
    assert tracing_spans.parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01") is None
    assert tracing_spans.parse_traceparent("00-xyz") is None


def test_the_hand_made_otlp_encoding_is_what_opentelemetry_proto_decodes() -> None:
    """Every field jobcar's encoder writes, read back by the official message classes."""
    pytest.importorskip("opentelemetry.proto")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from jobcar import tracing_spans
    from jobcar.config_types import TracingSettings

    span = tracing_spans.Span(bytes(range(16)), bytes(range(8)), True, "process défault", tracing_spans.CONSUMER,
                              {"s": "x" * 200, "i": 7, "neg": -3, "f": 0.25, "b": True, "list": ["a/1", "b/2"]},
                              1_000)  # fmt: skip
    span.add_event("jobcar.leased", {"jobcar.queued_ms": 12}, 2_000)
    span.links.append((bytes(16 * [1]), bytes(8 * [2])))
    span.error("exit code 1")
    span.end = 3_000
    body = tracing_spans._encode_spans(tracing_spans._resource(TracingSettings(service_name="svc")), [span] * 2)
    request = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = request.resource_spans
    resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert resource["service.name"] == "svc"
    [scope_spans] = resource_spans.scope_spans
    assert scope_spans.scope.name == "jobcar"
    decoded = scope_spans.spans[1]
    assert (decoded.trace_id, decoded.span_id, decoded.parent_span_id) == (
        bytes(range(16)),
        span.span_id,
        bytes(range(8)),
    )
    assert (decoded.name, decoded.kind, decoded.start_time_unix_nano, decoded.end_time_unix_nano) == (
        "process défault", 5, 1_000, 3_000)  # fmt: skip
    attributes = {kv.key: kv.value for kv in decoded.attributes}
    assert attributes["s"].string_value == "x" * 200
    assert (attributes["i"].int_value, attributes["neg"].int_value) == (7, -3)
    assert (attributes["f"].double_value, attributes["b"].bool_value) == (0.25, True)
    assert [v.string_value for v in attributes["list"].array_value.values] == ["a/1", "b/2"]
    [event] = decoded.events
    assert (event.name, event.time_unix_nano, event.attributes[0].key, event.attributes[0].value.int_value) == (
        "jobcar.leased", 2_000, "jobcar.queued_ms", 12)  # fmt: skip
    [link] = decoded.links
    assert (link.trace_id, link.span_id) == (bytes(16 * [1]), bytes(8 * [2]))
    assert (decoded.status.code, decoded.status.message) == (2, "exit code 1")


def test_sampling_follows_a_parent_and_else_the_ratio() -> None:
    from jobcar import tracing_otel, tracing_spans
    from jobcar.config_types import TracingSettings
    from jobcar.job import Job, State

    def attempt(tracer: tracing_otel.Tracer, traceparent: str | None) -> tracing_spans.Span:
        return tracer.attempt(
            Job(id="j", queue="q", type="t", payload=b"", state=State.ACTIVE, traceparent=traceparent)
        )

    parent = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
    never = tracing_otel.Tracer(TracingSettings(enabled=True, sampling_ratio=0.0, endpoint="http://127.0.0.1:9"))
    always = tracing_otel.Tracer(TracingSettings(enabled=True, sampling_ratio=1.0, endpoint="http://127.0.0.1:9"))
    try:
        assert not attempt(never, None).sampled  # a trace that begins here: the ratio decides
        assert attempt(always, None).sampled
        followed = attempt(never, f"00-{parent}-01")  # a sampled producer: recorded whatever the ratio
        assert followed.sampled
        assert followed.traceparent.startswith(f"00-{parent[:32]}-")
        unsampled = attempt(always, f"00-{parent}-00")  # an unsampled producer: not recorded, its context passed on
        assert not unsampled.sampled
        assert unsampled.traceparent.endswith("-00")
        call, traceparent = always.handler_call(unsampled, Job(id="j", queue="q", type="t", payload=b"",
                                                               state=State.ACTIVE), _command_handler())  # fmt: skip
        assert traceparent == call.traceparent
        assert traceparent.startswith(f"00-{parent[:32]}-")
        assert traceparent.endswith("-00")
        half = tracing_otel.Tracer(TracingSettings(enabled=True, sampling_ratio=0.5, endpoint="http://127.0.0.1:9"))
        try:
            sampled = sum(attempt(half, None).sampled for _ in range(4000))
        finally:
            half.shutdown()
        assert 1600 < sampled < 2400
    finally:
        never.shutdown()
        always.shutdown()


def _command_handler() -> Any:
    from jobcar.config_types import Backoff, CommandHandler

    return CommandHandler(type="t", command=("cat",), timeout=1.0, max_attempts=1, backoff=Backoff(), max_retry_after=1)
