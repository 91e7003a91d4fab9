"""Traces end to end (issue 36): a real daemon with tracing on exports to a real OTLP/HTTP receiver (protobuf
decoded with opentelemetry-proto), and a handler instrumented with OpenTelemetry's SDK, in its own process,
continues the trace it was given."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (make test installs it)")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from jobcar import Client, tracing
from jobcar.job import State
from tests.integration.daemon_harness import (
    DaemonProcess,
    HandlerServer,
    Received,
    listen_url,
    post,
    wait_gone,
    wait_state,
    write_config,
)
from tests.integration.driver import QueueDriver
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.servers import RedisServer, wait_for

#: The same on every server (it tests the exported traces): not run again on the fallback server (Makefile).
pytestmark = pytest.mark.one_server

#: A command handler instrumented with OpenTelemetry's SDK: its span continues TRACEPARENT, and it exports to the
#: receiver itself before it exits. Its first attempt fails (exit 1); the second succeeds.
TRACED_HANDLER = textwrap.dedent(
    """\
    import os, sys
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider(resource=Resource.create({"service.name": "ship-handler"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP_URL"] + "/v1/traces")))
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ.get("TRACEPARENT", "")})
    attempt = os.environ["JOBCAR_ATTEMPT"]
    with provider.get_tracer("ship").start_as_current_span("ship the order", context=parent,
                                                            attributes={"attempt": attempt}):
        sys.stdin.read()
    provider.shutdown()
    sys.exit(1 if attempt == "1" else 0)
    """
)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as running:
        yield running


def _one(spans: list[ReceivedSpan], what: str) -> ReceivedSpan:
    assert len(spans) == 1, f"{what}: {spans}"
    return spans[0]


def _traceparent(span: ReceivedSpan) -> str:
    return f"00-{span.trace_id}-{span.span_id}-01"


def test_a_job_from_an_http_request_retried_then_done_with_a_dependent_job_is_one_tree(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    q: QueueDriver,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    script = tmp_path / "ship.py"
    script.write_text(TRACED_HANDLER)
    notified: list[Received] = []

    def notify(req: Received) -> tuple[int, dict[str, str], bytes]:
        notified.append(req)
        return 200, {}, b"{}"

    handlers_config: dict[str, Any] = {
        "order.ship": {
            "command": [sys.executable, str(script)],
            "env": {"OTLP_URL": receiver.url},
            "env_allow": ["PYTHONPATH"],
        },
        "order.notify": {"url": handlers.url("/notify", notify)},
    }
    config = write_config(
        tmp_path,
        redis_server.url,
        namespace,
        handlers_config,
        result_ttl="1h",
        tracing={"enabled": True, "endpoint": receiver.url, "service_name": "jobcar-test"},
    )
    # Exported 50 ms after a span ends rather than 5 s (the SDK's own variable): the test waits for less.
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    base = listen_url(daemon)

    # The app's request span, exported by the app (this test) to the same receiver.
    app = TracerProvider(resource=Resource.create({"service.name": "shop"}))
    app.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.url + "/v1/traces")))
    with app.get_tracer("shop").start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request_span:
        context = request_span.get_span_context()
        header = f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
        headers = {"Content-Type": "application/json", "traceparent": header}
        status, shipped = post(
            base + "/v1/jobs", json.dumps({"type": "order.ship", "payload": {"n": 1}}).encode(), headers
        )
        assert status == 201, shipped
        body = {"type": "order.notify", "payload": {"n": 1}, "after": [shipped["id"]]}
        status, notice = post(base + "/v1/jobs", json.dumps(body).encode(), headers)
        assert status == 201, notice
    app.shutdown()
    request = _one(receiver.named("POST /orders"), "the app's request span")

    wait_state(q, notice["id"], State.DONE, daemon)
    # Every span of the story: 1 request, 2 producers, 3 consumers, 3 handler calls, 2 spans of the ship handler.
    wait_for(lambda: len(receiver.spans) >= 11, timeout=30, what="the spans of both jobs")

    # The producer spans: children of the request's header, one per enqueue, per the messaging conventions.
    send_ship = _one(receiver.named("send default", **{"messaging.message.id": shipped["id"]}), "ship's send")
    send_notice = _one(receiver.named("send default", **{"messaging.message.id": notice["id"]}), "notify's send")
    for send in (send_ship, send_notice):
        assert (send.kind, send.service, send.trace_id, send.parent_span_id) == (
            "producer",
            "jobcar-test",
            request.trace_id,
            request.span_id,
        )
        assert send.attributes["messaging.system"] == "jobcar"
        assert send.attributes["messaging.destination.name"] == "default"
        assert send.attributes["messaging.operation.type"] == "send"
    # The job carries its producer span's context.
    assert q.job(shipped["id"]).traceparent == _traceparent(send_ship)

    # Ship's two attempts: consumer spans under its producer span, the first retried, the second done.
    attempts = sorted(
        receiver.named("process default", **{"messaging.message.id": shipped["id"]}),
        key=lambda s: s.attributes["jobcar.attempt"],
    )
    assert [(s.kind, s.parent_span_id, s.trace_id) for s in attempts] == [
        ("consumer", send_ship.span_id, request.trace_id)
    ] * 2
    first, second = attempts
    assert first.attributes["jobcar.attempt"] == 1
    assert first.attributes["jobcar.outcome"] == "retried"
    assert first.attributes["jobcar.job.type"] == "order.ship"
    assert first.attributes["messaging.destination.name"] == "default"
    assert 0 <= first.attributes["jobcar.retry.delay_s"] <= 0.2  # the test config's backoff (base 50 ms, max 200 ms)
    assert first.status_code == 2  # error: the attempt failed
    assert "exit code 1" in first.status_message
    assert (second.attributes["jobcar.attempt"], second.attributes["jobcar.outcome"]) == (2, "done")
    for attempt in attempts:
        leased = attempt.event("jobcar.leased")
        assert leased is not None
        assert leased["jobcar.queued_ms"] >= 0

    # Each attempt called its handler under a client span, and the handler, in its own process with the SDK,
    # continued the trace from TRACEPARENT.
    for attempt in attempts:
        call = _one(
            [s for s in receiver.named("handle order.ship") if s.parent_span_id == attempt.span_id],
            f"the handler call of attempt {attempt.attributes['jobcar.attempt']}",
        )
        assert (call.kind, call.trace_id, call.attributes["jobcar.handler"]) == ("client", request.trace_id, "command")
        handled = _one(
            [s for s in receiver.named("ship the order") if s.parent_span_id == call.span_id], "the handler's own span"
        )
        assert (handled.service, handled.trace_id) == ("ship-handler", request.trace_id)
        assert handled.attributes["attempt"] == str(attempt.attributes["jobcar.attempt"])

    # The dependent job: its attempt is a child of its own producer span, linked to the job it waited for
    # (that job's traceparent: ship's producer span), with the wait as an event.
    waited = _one(receiver.named("process default", **{"messaging.message.id": notice["id"]}), "notify's attempt")
    assert (waited.parent_span_id, waited.attributes["jobcar.outcome"]) == (send_notice.span_id, "done")
    assert waited.links == [(send_ship.trace_id, send_ship.span_id)]
    waiting = waited.event("jobcar.waiting_for_dependencies")
    assert waiting is not None
    assert waiting["jobcar.dependencies"] == [f"default/{shipped['id']}"]
    # Its HTTP handler was given its call's span as traceparent, not the job's.
    call = _one([s for s in receiver.named("handle order.notify") if s.parent_span_id == waited.span_id], "call")
    assert call.attributes["url.full"] == handlers.url("/notify", notify)
    [request_to_handler] = notified
    assert request_to_handler.headers["traceparent"] == _traceparent(call)

    # The job-duration histogram's exemplars name the attempts' traces, in the OpenMetrics exposition.
    scrape = urllib.request.Request(base + "/metrics", headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(scrape, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    exemplar_lines = [
        line for line in text.splitlines() if line.startswith("jobcar_job_duration_seconds_bucket") and " # {" in line
    ]
    assert any(f'trace_id="{request.trace_id}"' in line for line in exemplar_lines), exemplar_lines
    # A scraper that asks for the Prometheus text gets it, as before.
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")


def test_the_metrics_of_metrics_go_over_otlp_with_the_spans_exporter_settings(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    q: QueueDriver,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    tracing = {
        "enabled": True,
        "endpoint": receiver.url,
        "headers": {"x-api-key": "k-123"},
        "metrics_interval": "200ms",
    }
    handler = {"t.ok": {"url": handlers.url("/ok", lambda req: (200, {}, b""))}}
    config = write_config(tmp_path, redis_server.url, namespace, handler, tracing=tracing)
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    status, job = post(
        listen_url(daemon) + "/v1/jobs", b'{"type": "t.ok", "payload": {}}', {"Content-Type": "application/json"}
    )
    assert status == 201, job
    wait_gone(q, job["id"], daemon)  # done, and deleted (no result_ttl)

    def finished() -> list[Any]:
        with receiver.lock:
            return [
                p
                for p in receiver.points
                if p[1] == "jobcar_jobs_finished" and p[3].get("outcome") == "done" and p[4] >= 1
            ]

    wait_for(finished, timeout=30, what="jobcar_jobs_finished{outcome=done} pushed over OTLP")
    service, _, kind, labels, _ = finished()[-1]
    assert (service, kind, labels) == ("jobcar", "sum", {"queue": "default", "type": "t.ok", "outcome": "done"})
    with receiver.lock:
        durations = [
            p
            for p in receiver.points
            if p[1] == "jobcar_job_duration_seconds" and p[3] == {"queue": "default", "type": "t.ok"}
        ]
        queue_depths = [p for p in receiver.points if p[1] == "jobcar_queue_jobs"]
        requests = list(receiver.requests)
    assert durations[-1][2] == "histogram"
    assert durations[-1][4][0] >= 1  # (count, sum)
    assert queue_depths
    assert queue_depths[-1][2] == "gauge"
    # One exporter config for both: the same endpoint and headers for the spans and the metrics.
    assert {path for path, _ in requests} == {"/v1/traces", "/v1/metrics"}
    assert all({k.lower(): v for k, v in headers.items()}.get("x-api-key") == "k-123" for _, headers in requests)


def test_an_attempt_span_tells_a_snooze_and_the_limits_that_held_it(
    tmp_path: Path, redis_server: RedisServer, namespace: str, q: QueueDriver, receiver: OtlpReceiver
) -> None:
    # t.snooze: its first run snoozes (exit 75, the delay on stdout), its second succeeds; one at a time in this
    # daemon, each first run long enough for the other to wait. t.limited: one at a time fleet-wide (a limit in
    # Redis), each run long enough for the other to wait.
    marker = tmp_path / "snoozed-once"
    snooze = f"if [ -e {marker}-$JOBCAR_JOB_ID ]; then exit 0; fi; touch {marker}-$JOBCAR_JOB_ID; sleep 0.3; "
    snooze += "echo 0.05; exit 75"
    handlers_config: dict[str, Any] = {
        "t.snooze": {"command": ["sh", "-c", snooze], "concurrency": 1},
        "t.limited": {"command": ["sh", "-c", "sleep 0.3"], "limits": {"concurrency": 1}},
    }
    config = write_config(
        tmp_path, redis_server.url, namespace, handlers_config, tracing={"enabled": True, "endpoint": receiver.url}
    )
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    base = listen_url(daemon)
    jobs = [{"type": job_type, "payload": {}} for job_type in ("t.snooze", "t.snooze", "t.limited", "t.limited")]
    status, answer = post(base + "/v1/jobs", json.dumps({"jobs": jobs}).encode(), {"Content-Type": "application/json"})
    assert status == 201, answer
    ids = [job["id"] for job in answer["jobs"]]
    for job_id in ids:
        wait_gone(q, job_id, daemon)
    # Each t.snooze job: a snoozed attempt and a done one; each t.limited: one done attempt.
    wait_for(lambda: len(receiver.named("process default", **{"jobcar.outcome": "done"})) == 4, timeout=30,
             what="the four done attempts")  # fmt: skip
    wait_for(lambda: len(receiver.named("process default", **{"jobcar.outcome": "retried"})) == 2, timeout=30,
             what="the two snoozed attempts")  # fmt: skip

    snoozed = receiver.named("process default", **{"jobcar.outcome": "retried"})
    for span in snoozed:
        event = span.event("jobcar.snoozed")
        assert event is not None, span.events
        assert event["jobcar.snooze.delay_s"] == 0.05
        assert span.status_code == 0  # a snooze is no failure
    # The one of two t.snooze attempts that found the other running waited for this daemon's slot of its type.
    snooze_attempts = [s for s in receiver.named("process default") if s.attributes["jobcar.job.type"] == "t.snooze"]
    held_here = [s.event("jobcar.held_by_limit") for s in snooze_attempts if s.event("jobcar.held_by_limit")]
    assert {"jobcar.limit": "concurrency", "jobcar.limit.value": 1} in held_here
    # The t.limited job the fleet-wide limit held says since when, and for how long.
    limited = receiver.named("process default", **{"jobcar.job.type": "t.limited"})
    held = [s.event("jobcar.held_by_limit") for s in limited if s.event("jobcar.held_by_limit")]
    assert len(held) == 1, [s.events for s in limited]
    assert held[0]["jobcar.limit"] == "fleet-wide"
    assert held[0]["jobcar.held_ms"] >= 100  # the other job's run held it (it sleeps 300 ms)


#: An app that set up OpenTelemetry's SDK (its global provider, exporting to the receiver) and enqueues with the
#: Python client inside its own span: the client's producer span is the app's, a child of that span.
TRACED_PRODUCER = textwrap.dedent(
    """\
    import sys
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from jobcar import Client

    otlp, redis_url, namespace = sys.argv[1:]
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp + "/v1/traces")))
    trace.set_tracer_provider(provider)
    with Client.from_url(redis_url, namespace=namespace) as client:
        with trace.get_tracer("shop").start_as_current_span("checkout"):
            job = client.enqueue("t.ok", {"order": 1})
            mine = client.enqueue("t.ok", {"order": 2}, traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")
    provider.shutdown()
    print(job.id, mine.id)
    """
)


def test_the_python_client_in_an_app_that_traces_makes_the_producer_span(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    q: QueueDriver,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    script = tmp_path / "app.py"
    script.write_text(TRACED_PRODUCER)
    handler = {"t.ok": {"url": handlers.url("/ok", lambda req: (200, {}, b""))}}
    config = write_config(tmp_path, redis_server.url, namespace, handler, result_ttl="1h",
                          tracing={"enabled": True, "endpoint": receiver.url})  # fmt: skip
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    app = subprocess.run([sys.executable, str(script), receiver.url, redis_server.url, namespace],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    job_id, own_id = app.stdout.split()
    wait_state(q, job_id, State.DONE, daemon)
    wait_state(q, own_id, State.DONE, daemon)
    wait_for(lambda: len(receiver.named("process default")) == 2, timeout=30, what="both attempts' spans")

    checkout = _one(receiver.named("checkout"), "the app's span")
    send = _one(receiver.named("send default"), "the client's producer span (one: the other job brought its own)")
    assert (send.service, send.kind, send.parent_span_id) == ("shop-app", "producer", checkout.span_id)
    assert send.attributes["messaging.message.id"] == job_id
    assert send.attributes["messaging.system"] == "jobcar"
    stored = q.job(job_id)
    assert stored is not None
    assert stored.traceparent is not None
    assert stored.traceparent[3:52] == f"{send.trace_id}-{send.span_id}"  # its flags are the SDK's (01 or 03)
    attempt = _one(receiver.named("process default", **{"messaging.message.id": job_id}), "its attempt")
    assert (attempt.trace_id, attempt.parent_span_id) == (checkout.trace_id, send.span_id)
    # A job that brings its own traceparent keeps it: its attempt continues that context.
    own = _one(receiver.named("process default", **{"messaging.message.id": own_id}), "the other attempt")
    assert (own.trace_id, own.parent_span_id) == ("ab" * 16, "cd" * 8)


def test_the_spans_still_queued_go_out_when_the_daemon_stops(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    q: QueueDriver,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    handler = {"t.ok": {"url": handlers.url("/ok", lambda req: (200, {}, b""))}}
    config = write_config(tmp_path, redis_server.url, namespace, handler, tracing={"enabled": True,
                          "endpoint": receiver.url})  # fmt: skip
    # Exports every 60 s: only the exit's flush can send these spans within the test.
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "60000"}).start()
    status, job = post(listen_url(daemon) + "/v1/jobs", b'{"type": "t.ok"}', {"Content-Type": "application/json"})
    assert status == 201, job
    wait_gone(q, job["id"], daemon)
    assert receiver.spans == []
    daemon.stop()
    assert daemon.wait() == 0
    assert [s.name for s in sorted(receiver.spans, key=lambda s: s.start_ns)] == [
        "send default", "process default", "handle t.ok"]  # fmt: skip


def test_a_batch_callbacks_attempt_links_to_the_batch(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    q: QueueDriver,
    client: Client,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    ok = handlers.url("/ok", lambda req: (200, {}, b""))
    config = write_config(tmp_path, redis_server.url, namespace, {"t.ok": {"url": ok}, "t.cb": {"url": ok}},
                          tracing={"enabled": True, "endpoint": receiver.url})  # fmt: skip
    daemon = DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()
    jobs = {"jobs": [{"type": "t.ok", "batch": "b1"}, {"type": "t.ok", "batch": "b1"}]}
    status, answer = post(listen_url(daemon) + "/v1/jobs", json.dumps(jobs).encode(),
                          {"Content-Type": "application/json"})  # fmt: skip
    assert status == 201, answer
    seal = client.seal_batch("b1", on_complete=("t.cb", {}))
    [callback] = seal.callbacks
    wait_gone(q, callback.id, daemon)
    wait_for(lambda: receiver.named("process default", **{"messaging.message.id": callback.id}), timeout=30,
             what="the callback's attempt")  # fmt: skip
    send = _one(receiver.named("send default"), "the batch's producer span")
    assert send.attributes["messaging.batch.message_count"] == 2
    attempt = _one(receiver.named("process default", **{"messaging.message.id": callback.id}), "the callback's")
    assert attempt.links == [(send.trace_id, send.span_id)]
    # The batch's counters keep that context, and their expiry: the field added nothing that outlives them.
    assert q.redis.hget(q.keys.batch("b1"), "traceparent") == _traceparent(send).encode()
    assert q.redis.ttl(q.keys.batch("b1")) > 0


def test_a_partition_sent_in_chunks_is_one_producer_span_with_its_job_count(
    q: QueueDriver, client: Client, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Spark partition's sender does (spark_rows.send, where the executor traces), with the daemon's tracer
    exporting to the receiver: one span for every chunk, the count of the jobs, and each job carrying its context."""
    from jobcar import spark_rows, tracing_otel
    from jobcar.config_types import TracingSettings

    tracer = tracing_otel.Tracer(TracingSettings(enabled=True, endpoint=receiver.url))
    monkeypatch.setattr(tracing, "active", tracer)  # what for_producer() gives the sender
    own = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    specs: list[Any] = [("t.row", {"n": n}, {"job_id": f"row-{n}", "queue": "default"}) for n in range(4)]
    specs.append(("t.row", {"n": 4}, {"job_id": "row-4", "queue": "default", "traceparent": own}))

    sent = spark_rows.send(client, iter(specs), chunk=2)
    assert sent.rows == 5
    tracer.shutdown()  # sends what it holds
    [span] = receiver.spans
    assert (span.name, span.kind, span.attributes["messaging.batch.message_count"]) == ("send default", "producer", 5)
    stored = [q.job(f"row-{n}") for n in range(5)]
    assert [job.traceparent if job else None for job in stored] == [_traceparent(span)] * 4 + [own]


def test_a_schedule_fire_is_the_root_of_its_jobs_trace(
    tmp_path: Path,
    redis_server: RedisServer,
    namespace: str,
    receiver: OtlpReceiver,
    handlers: HandlerServer,
) -> None:
    handler = {"t.tick": {"url": handlers.url("/tick", lambda req: (200, {}, b""))}}
    config = write_config(tmp_path, redis_server.url, namespace, handler, schedules={"beat": {"every": "1s",
                          "type": "t.tick"}}, tracing={"enabled": True, "endpoint": receiver.url})  # fmt: skip
    DaemonProcess(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start()

    def a_fired_job_ran() -> list[tuple[ReceivedSpan, ReceivedSpan]]:
        fires = {s.span_id: s for s in receiver.named("fire beat")}
        return [(fires[s.parent_span_id], s) for s in receiver.named("process default") if s.parent_span_id in fires]

    wait_for(a_fired_job_ran, timeout=30, what="a fired job's attempt under its fire's span")
    fire, attempt = a_fired_job_ran()[0]
    assert (fire.kind, fire.parent_span_id, fire.trace_id) == ("producer", "", attempt.trace_id)
    assert fire.attributes["jobcar.schedule"] == "beat"
    assert fire.attributes["jobcar.schedule.outcome"] == "fired"
    assert fire.attributes["messaging.message.id"] == attempt.attributes["messaging.message.id"]
    assert attempt.attributes["messaging.message.id"] == f"beat@{fire.attributes['jobcar.schedule.tick_ms']}"
