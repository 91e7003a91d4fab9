"""The daemon's HTTP listener (jobcar.api) on 127.0.0.1, driven by a real aiohttp client against real Redis:
every route, the bearer token, bad input, limits, and Redis refusing writes (guarantees 8, 12, 15 of
docs/delivery-semantics.md)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from jobcar.api import (
    METRICS_CONTENT_TYPE,
    ApiContext,
    bound_port,
    build_app,
    check_exposure,
    start_listener,
)
from jobcar.client import AsyncClient, Client
from jobcar.config_types import Backoff, Config, HttpHandler, Limits, Rate
from jobcar.enqueue_request import MAX_BATCH_JOBS
from jobcar.formats import redact
from jobcar.job import State
from jobcar.keys import QueueKeys, queues_key
from jobcar.listen import is_loopback
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import post
from tests.integration.driver import QueueDriver
from tests.integration.test_cli_ops import talk_back
from tests.servers import RedisServer, find_server_binary, free_port, wait_for

TOKEN = "t0ken-for-tests"
MAX_PAYLOAD = 4096
METRICS = b'# HELP jobcar_up Whether the daemon runs.\n# TYPE jobcar_up gauge\njobcar_up{queue="default"} 1\n'
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BINARY = b'\x00\xff\xfe{"user": 42}\x00\x80 ; $(id) `id`\r\n'


@dataclass
class Reply:
    status: int
    body: Any
    headers: Mapping[str, str]


@dataclass
class Probe:
    """What the fake daemon answers for readiness, and how often it was asked to drain."""

    ready: bool = True
    reason: str = "ready"
    drains: int = 0

    async def readiness(self) -> tuple[bool, str]:
        return self.ready, self.reason

    def drain(self) -> None:
        self.drains += 1


@dataclass
class Api:
    http: aiohttp.ClientSession  # sends the bearer token (when there is one)
    anon: aiohttp.ClientSession  # sends no Authorization header
    client: AsyncClient
    probe: Probe = field(default_factory=Probe)
    port: int = 0  # the listener's

    async def call(self, method: str, path: str, *, anon: bool = False, **kwargs: Any) -> Reply:
        """One request; every answer of the API is JSON, errors included."""
        async with (self.anon if anon else self.http).request(method, path, **kwargs) as response:
            raw = await response.read()
            assert response.content_type == "application/json", (response.status, raw)
            return Reply(response.status, json.loads(raw), response.headers)

    async def enqueue(self, body: object) -> Reply:
        return await self.call("POST", "/v1/jobs", json=body)

    async def post_raw(self, data: bytes) -> Reply:
        return await self.call("POST", "/v1/jobs", data=data, headers={"Content-Type": "application/json"})

    async def get(self, job_id: str, queue: str | None = None) -> Reply:
        return await self.call("GET", f"/v1/jobs/{job_id}", params={"queue": queue} if queue else {})

    async def cancel(self, job_id: str, queue: str | None = None) -> Reply:
        return await self.call("DELETE", f"/v1/jobs/{job_id}", params={"queue": queue} if queue else {})


@contextlib.asynccontextmanager
async def running_api(
    redis_url: str,
    namespace: str,
    *,
    token: str | None = TOKEN,
    max_payload_bytes: int = MAX_PAYLOAD,
    **settings: Any,
) -> AsyncIterator[Api]:
    """The listener on 127.0.0.1, port 0, with a real AsyncClient; everything closed on exit. `settings` are
    more Config fields."""
    config = Config(
        source="test.yaml",
        namespace=namespace,
        listen="127.0.0.1:0",
        api_token=token,
        max_payload_bytes=max_payload_bytes,
        **settings,
    )
    # As the daemon makes it (daemon.py): concurrent requests share round trips.
    client = AsyncClient.from_url(redis_url, namespace=namespace, max_payload_bytes=max_payload_bytes,
                                  shared_round_trips=True)  # fmt: skip
    probe = Probe()

    async def metrics() -> bytes:
        return METRICS

    context = ApiContext(config=config, client=client, readiness=probe.readiness, drain=probe.drain, metrics=metrics)
    try:
        runner = await start_listener(build_app(context), config.listen)
        try:
            base = f"http://127.0.0.1:{bound_port(runner)}"
            auth = {"Authorization": f"Bearer {token}"} if token else {}
            async with aiohttp.ClientSession(base, headers=auth) as http, aiohttp.ClientSession(base) as anon:
                yield Api(http, anon, client, probe, bound_port(runner))
        finally:
            await runner.cleanup()
    finally:
        await client.close()


@pytest.fixture
async def api(redis_server: RedisServer, namespace: str) -> AsyncIterator[Api]:
    """The listener (with the bearer token) on the session's server, in the test's namespace."""
    async with running_api(redis_server.url, namespace) as running:
        yield running


def job_keys(r: redis.Redis, namespace: str) -> list[bytes]:
    """Every key of every queue of the namespace (not the queue-name set)."""
    return sorted(r.scan_iter(match=f"{namespace}:{{*"))


# -- probes and drain --------------------------------------------------------------------------------------


async def test_probes_answer_without_the_token(api: Api) -> None:
    assert (await api.call("GET", "/healthz", anon=True)).body == {"status": "ok"}
    ready = await api.call("GET", "/readyz", anon=True)
    assert (ready.status, ready.body) == (200, {"status": "ready"})
    api.probe.ready, api.probe.reason = False, "redis unreachable"
    ready = await api.call("GET", "/readyz", anon=True)
    assert (ready.status, ready.body) == (503, {"status": "not ready", "reason": "redis unreachable"})
    async with api.anon.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == METRICS_CONTENT_TYPE
        assert await response.read() == METRICS


async def test_drain_calls_the_daemon_and_needs_the_token(api: Api) -> None:
    denied = await api.call("POST", "/v1/drain", anon=True)
    assert denied.status == 401
    assert api.probe.drains == 0
    reply = await api.call("POST", "/v1/drain")
    assert (reply.status, reply.body, api.probe.drains) == (202, {"status": "draining"}, 1)


# -- enqueue and read back ----------------------------------------------------------------------------------


async def test_enqueue_one_job_and_read_it_back(api: Api, namespace: str, r: redis.Redis) -> None:
    body = {"type": "email.welcome", "payload": {"user": 42, "name": "Zoë"}, "queue": "critical",
            "max_attempts": 5, "timeout": "30s", "traceparent": TRACEPARENT, "meta": {"tenant": "a"}}  # fmt: skip
    reply = await api.enqueue(body)
    assert reply.status == 201, reply.body
    job_id = reply.body["id"]
    assert reply.body == {"id": job_id, "queue": "critical", "state": "pending", "status": "created"}
    assert QueueDriver(r, namespace, "critical").where(job_id) is State.PENDING

    for queue in (None, "critical"):
        job = (await api.get(job_id, queue)).body
        assert job["payload"] == {"user": 42, "name": "Zoë"}
        assert "payload_base64" not in job
        assert (job["type"], job["state"], job["attempt"], job["max_attempts"]) == (
            "email.welcome",
            "pending",
            0,
            5,
        )
        assert (job["timeout_seconds"], job["traceparent"], job["meta"]) == (30.0, TRACEPARENT, {"tenant": "a"})
        assert job["content_type"] == "application/json"
        assert job["errors"] == []
        assert job["run_at"] is None
        assert abs(time_of(job["created_at"]) - time.time()) < 60
    missing = await api.get(job_id, "default")
    assert (missing.status, missing.body) == (404, {"error": "no such job"})
    assert (await api.get("no-such-job")).status == 404


async def test_concurrent_enqueues_share_round_trips_each_with_its_own_answer(
    api: Api, namespace: str, r: redis.Redis
) -> None:
    """Many producers posting one job each at once (the daemon's API client shares round trips): each request
    gets what it alone would have: created, exists for an id stored before, 409 for a held unique key, 429 from a
    full queue, 400 for its own bad body."""
    r.hset(QueueKeys.of(namespace, "full").settings, "max_pending", 1)
    first = await api.enqueue({"type": "t", "id": "stored", "payload": {}})
    assert first.status == 201
    held = await api.enqueue({"type": "t", "unique_key": "nightly", "unique_for": "1h", "payload": {}})
    assert held.status == 201
    bodies: list[object] = [{"type": "t", "id": f"new-{n}", "payload": {"n": n}} for n in range(60)]
    bodies += [{"type": "t", "id": "stored", "payload": {}}] * 5
    bodies += [{"type": "t", "unique_key": "nightly", "unique_for": "1h", "payload": {}}] * 5
    bodies += [{"type": "t", "queue": "full", "id": f"full-{n}", "payload": {}} for n in range(5)]
    bodies += [{"type": "t", "delay": "soon"}] * 5
    before = api.client.round_trips.sent if api.client.round_trips else 0
    replies = await asyncio.gather(*(api.enqueue(body) for body in bodies))
    statuses = [reply.status for reply in replies]
    assert statuses[:60] == [201] * 60
    assert [(reply.body["id"], reply.body["status"]) for reply in replies[:60]] == [
        (f"new-{n}", "created") for n in range(60)
    ]
    assert [(reply.status, reply.body["status"]) for reply in replies[60:65]] == [(200, "exists")] * 5
    assert statuses[65:70] == [409] * 5
    assert sorted(statuses[70:75]) == [201] + [429] * 4  # one fits under max_pending 1, whichever came first
    assert statuses[75:] == [400] * 5
    assert r.llen(QueueKeys.of(namespace, "default").pending) == 62
    assert api.client.round_trips is not None
    assert api.client.round_trips.sent - before < 60  # the 70 that reached Redis shared round trips


def time_of(rfc3339: str) -> float:
    assert rfc3339.endswith("Z"), rfc3339
    return datetime.fromisoformat(rfc3339).timestamp()


async def test_delay_and_run_at_schedule_the_job(api: Api) -> None:
    later = time.time() + 3600
    cases: list[tuple[dict[str, Any], str]] = [
        ({"delay": "10s"}, "scheduled"),
        ({"delay": 10}, "scheduled"),
        ({"run_at": later}, "scheduled"),
        ({"run_at": "2999-01-02T03:04:05+02:00"}, "scheduled"),
        ({"run_at": "2020-01-01T00:00:00Z"}, "pending"),  # in the past: runs now
        ({"delay": "0s"}, "pending"),
    ]
    for options, state in cases:
        reply = await api.enqueue({"type": "report.build", **options})
        assert (reply.status, reply.body["state"]) == (201, state), options
    scheduled = (await api.enqueue({"type": "t", "run_at": "2999-01-02T03:04:05Z"})).body
    job = (await api.get(scheduled["id"])).body
    assert (job["state"], job["run_at"]) == ("scheduled", "2999-01-02T03:04:05.000Z")


async def test_raw_payloads_in_base64(api: Api, namespace: str, r: redis.Redis) -> None:
    encoded = base64.b64encode(BINARY).decode()
    reply = await api.enqueue({"type": "blob.store", "payload_base64": encoded})
    assert reply.status == 201, reply.body
    job = (await api.get(reply.body["id"])).body
    assert (job["payload_base64"], job["content_type"]) == (encoded, "application/octet-stream")
    assert r.hget(f"{namespace}:{{default}}:job:{reply.body['id']}", "payload") == BINARY

    text = await api.enqueue({"type": "t", "payload_base64": "aGVsbG8=", "content_type": "text/plain"})
    job = (await api.get(text.body["id"])).body
    assert (job["payload_base64"], job["content_type"], "payload" in job) == ("aGVsbG8=", "text/plain", False)

    # JSON sent as bytes reads back as JSON; JSON that does not parse reads back as base64.
    for raw, shown in ((b'{"a": [1, 2]}', {"payload": {"a": [1, 2]}}), (b"{oops", {"payload_base64": "e29vcHM="})):
        sent = await api.enqueue(
            {"type": "t", "payload_base64": base64.b64encode(raw).decode(), "content_type": "application/json"}
        )
        job = (await api.get(sent.body["id"])).body
        assert {k: job[k] for k in shown} == shown
        assert len(set(job) & {"payload", "payload_base64"}) == 1


async def test_a_caller_chosen_id_is_add_if_absent(api: Api) -> None:
    first = await api.enqueue({"type": "order.ship", "id": "order/17", "payload": 1, "delay": 60})
    again = await api.enqueue({"type": "order.ship", "id": "order/17", "payload": 2})
    assert (first.status, first.body["status"]) == (201, "created")
    assert (again.status, again.body) == (200, {"id": "order/17", "queue": "default", "state": "scheduled",
                                                 "status": "exists"})  # fmt: skip
    job = await api.get("order/17")  # an id with a slash is one path segment too
    assert (job.status, job.body["payload"]) == (200, 1)


async def test_priority_deadline_window_and_debounce_are_taken_and_shown(api: Api) -> None:
    body = {"type": "t", "priority": 3, "expires_in": "1h", "unique_for": "1m", "unique_mode": "window", "key": "acme"}
    job = (await api.get((await api.enqueue(body)).body["id"])).body
    assert (job["priority"], job["unique_mode"], job["key"], job["held_for"]) == (3, "window", "acme", None)
    assert 3500 < time_of(job["expires_at"]) - time.time() <= 3600
    at = (await api.enqueue({"type": "t", "expires_at": "2999-01-02T03:04:05Z"})).body["id"]
    assert (await api.get(at)).body["expires_at"] == "2999-01-02T03:04:05.000Z"
    stream = {"type": "t", "debounce": "10s", "debounce_key": "user-7", "debounce_max_wait": "1m"}
    first = await api.enqueue({**stream, "payload": 1})
    second = await api.enqueue({**stream, "payload": 2})
    assert (first.status, first.body["state"]) == (201, "scheduled")
    assert (second.status, second.body) == (200, {**first.body, "status": "debounced"})
    waiting = (await api.get(first.body["id"])).body
    assert (waiting["payload"], waiting["debounce_key"]) == (2, "user-7")
    for bad in ({"priority": 10}, {"priority": True}, {"expires_at": "tomorrow"}, {"debounce": "soon"}, {"key": ""}):
        reply = await api.enqueue({"type": "t", **bad})
        assert reply.status == 400, (bad, reply.body)


async def test_a_type_or_queue_the_config_does_not_run_is_enqueued_with_a_warning_or_refused_when_strict(
    redis_server: RedisServer, namespace: str, r: redis.Redis
) -> None:
    handlers = {"email.welcome": HttpHandler(type="email.welcome", timeout=10.0, max_attempts=3, backoff=Backoff(),
                                             max_retry_after=60.0, url="http://127.0.0.1:1/")}  # fmt: skip
    for strict in (False, True):
        async with running_api(redis_server.url, namespace, handlers=handlers, strict_enqueue=strict) as api:
            known = await api.enqueue({"type": "email.welcome"})
            assert known.status == 201
            assert "Jobcar-Warning" not in known.headers
            typo = await api.enqueue({"jobs": [{"type": "email.welcom"}, {"type": "email.welcome", "queue": "lo"}]})
            if strict:
                assert typo.status == 400
                assert typo.body["error"] == (
                    "test.yaml has no handler for type 'email.welcom' (did you mean 'email.welcome'?); queue 'lo' "
                    "is not in the queues of test.yaml: nothing enqueued (strict_enqueue is on)"
                )
            else:
                assert typo.status == 201
                assert typo.headers["Jobcar-Warning"] == (
                    "test.yaml has no handler for type 'email.welcom' (did you mean 'email.welcome'?); queue 'lo' "
                    "is not in the queues of test.yaml"
                )
    assert r.llen(f"{namespace}:{{default}}:pending") == 3, "two known jobs and, without strict_enqueue, the typo"
    assert r.llen(f"{namespace}:{{lo}}:pending") == 1


async def test_a_jobs_own_backoff_is_taken_and_shown(api: Api) -> None:
    job = (await api.get((await api.enqueue({"type": "t", "backoff": "1m30s"})).body["id"])).body
    assert job["backoff_seconds"] == 90.0
    assert (await api.get((await api.enqueue({"type": "t"})).body["id"])).body["backoff_seconds"] is None
    for bad in ("0s", "soon", True, [1]):
        reply = await api.enqueue({"type": "t", "backoff": bad})
        assert (reply.status, "backoff" in reply.body["error"]) == (400, True), (bad, reply.body)


async def test_a_job_waits_for_others_and_its_document_shows_them(api: Api) -> None:
    first = (await api.enqueue({"type": "t", "id": "first"})).body
    other = (await api.enqueue({"type": "t", "id": "other", "queue": "low"})).body
    waiting = await api.enqueue({"type": "t", "after": ["first", ["low", "other"]], "on_dependency_failure": "run"})
    assert (waiting.status, waiting.body["state"]) == (201, "waiting")
    job = (await api.get(waiting.body["id"])).body
    assert job["after"] == job["waiting_for"] == ["default/first", "low/other"]
    assert (job["on_dependency_failure"], job["dependents"]) == ("run", [])
    assert (await api.get(first["id"])).body["dependents"] == [f"default/{waiting.body['id']}"]
    assert (await api.get(other["id"], queue="low")).body["dependents"] == [f"default/{waiting.body['id']}"]
    for bad in ({"after": []}, {"after": [["low"]]}, {"after": ["x"], "on_dependency_failure": "retry"}):
        reply = await api.enqueue({"type": "t", **bad})
        assert reply.status == 400, (bad, reply.body)


async def test_schedules_are_created_read_paused_triggered_and_removed(api: Api) -> None:
    spec = {"type": "report.build", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "payload": {"r": 1},
            "catchup": "all", "priority": 4}  # fmt: skip
    created = await api.call("PUT", "/v1/schedules/nightly", json=spec)
    assert (created.status, created.body) == (200, {"name": "nightly", "result": "created"})
    again = await api.call("PUT", "/v1/schedules/nightly", json=spec)
    assert again.body["result"] == "unchanged"
    shown = (await api.call("GET", "/v1/schedules/nightly")).body
    assert (shown["cron"], shown["timezone"], shown["payload"], shown["options"]) == (
        "0 3 * * *", "Europe/Berlin", {"r": 1}, {"priority": 4},
    )  # fmt: skip
    assert shown["next_tick"].endswith(("T01:00:00.000Z", "T02:00:00.000Z"))  # 03:00 in Berlin, CET or CEST
    listed = (await api.call("GET", "/v1/schedules")).body["schedules"]
    assert [s["name"] for s in listed] == ["nightly"]
    paused = await api.call("POST", "/v1/schedules/nightly/pause")
    assert paused.body == {"name": "nightly", "changed": True}
    triggered = (await api.call("POST", "/v1/schedules/nightly/trigger")).body
    job = (await api.get(triggered["job_id"])).body
    assert (job["schedule"], job["payload"], job["priority"]) == ("nightly", {"r": 1}, 4)
    assert job["scheduled_at"] is not None
    resumed = await api.call("POST", "/v1/schedules/nightly/resume")
    assert resumed.body == {"name": "nightly", "changed": True}
    removed = await api.call("DELETE", "/v1/schedules/nightly")
    assert removed.body == {"name": "nightly", "changed": True}
    gone = [("GET", ""), ("DELETE", ""), ("POST", "/trigger"), ("POST", "/pause")]
    for method, path in ((method, "/v1/schedules/nightly" + tail) for method, tail in gone):
        missing = await api.call(method, path)
        assert (missing.status, missing.body) == (404, {"error": "no such schedule"}), (method, path)
    bad_specs: list[tuple[dict[str, Any], str]] = [
        ({"type": "t"}, "give cron"),
        ({"type": "t", "every": "1m", "at": 1}, "unknown field(s): at"),
        ({"every": "1m"}, "type is required"),
        ({"type": "t", "cron": "99 * * * *"}, "cron"),
    ]
    for bad, message in bad_specs:
        refused = await api.call("PUT", "/v1/schedules/bad", json=bad)
        assert refused.status == 400, bad
        assert message in refused.body["error"]
    not_json = await api.call("PUT", "/v1/schedules/bad", data=b"{}", headers={"Content-Type": "text/plain"})
    assert not_json.status == 415
    assert (await api.call("GET", "/v1/schedules/nightly", anon=True)).status == 401


async def test_a_duplicate_unique_job_is_409_with_the_holder(api: Api) -> None:
    holder = await api.enqueue({"type": "sync.account", "payload": {"a": 1}, "unique_for": "1h", "unique_key": "k"})
    duplicate = await api.enqueue({"type": "sync.account", "payload": {"a": 2}, "unique_for": 60, "unique_key": "k"})
    assert holder.status == 201
    assert (duplicate.status, duplicate.body) == (409, {"error": "duplicate unique job", "id": holder.body["id"],
                                                        "queue": "default", "state": "pending"})  # fmt: skip
    # Without a key, the same type and payload are the same job.
    same = {"type": "sync.account", "payload": {"b": 1}, "unique_for": "10m"}
    first, second = await api.enqueue(same), await api.enqueue(same)
    assert (first.status, second.status, second.body["id"]) == (201, 409, first.body["id"])


async def test_a_batch_reports_each_jobs_status(api: Api, namespace: str, r: redis.Redis) -> None:
    await api.enqueue({"type": "t", "id": "taken"})
    holder = (await api.enqueue({"type": "t", "unique_for": "1h", "unique_key": "held"})).body
    jobs = [
        {"type": "t", "payload": 1},
        {"type": "t", "id": "taken"},
        {"type": "t", "unique_for": "1h", "unique_key": "held"},
        {"type": "t", "queue": "low", "delay": "1m"},
        {"type": "t", "payload_base64": "AAE="},
    ]
    reply = await api.enqueue({"jobs": jobs})
    assert reply.status == 201, reply.body
    results = reply.body["jobs"]
    assert [(j["status"], j["queue"], j["state"]) for j in results] == [
        ("created", "default", "pending"),
        ("exists", "default", "pending"),
        ("duplicate", "default", "pending"),
        ("created", "low", "scheduled"),
        ("created", "default", "pending"),
    ]
    assert results[1]["id"] == "taken"
    assert results[2]["id"] == holder["id"]
    assert QueueDriver(r, namespace, "low").where(results[3]["id"]) is State.SCHEDULED

    # One bad job fails the whole batch before anything is written.
    before = job_keys(r, namespace)
    bad = await api.enqueue({"jobs": [{"type": "t", "id": "fresh"}, {"type": "t", "max_attempts": 0}]})
    assert bad.status == 400, bad.body
    assert bad.body["error"].startswith("job #1: max_attempts"), bad.body
    assert job_keys(r, namespace) == before
    assert (await api.enqueue({"jobs": []})).body == {"jobs": []}


# -- bad input, limits, auth ----------------------------------------------------------------------------------


async def test_bad_input_is_400_and_writes_nothing(api: Api, namespace: str, r: redis.Redis) -> None:
    raw_cases = {
        b"{": "not valid JSON",
        b"": "not valid JSON",
        b'{"type": "t", "payload": NaN}': "not valid JSON",
        b'{"type": "t", "payload": "\xff\xfe"}': "not valid JSON",  # invalid UTF-8
        b"[1, 2]": "must be a JSON object",
        b'{"type": "t", "id": "bad\\ud800id"}': "not valid Unicode",  # a lone surrogate escape
        b'{"jobs": {"type": "t"}}': "jobs must be a list",
    }
    for data, message in raw_cases.items():
        reply = await api.post_raw(data)
        assert reply.status == 400, (data, reply.body)
        assert message in reply.body["error"], (data, reply.body)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"type": "t", "bogus": 1, "zz": 2}, "unknown field(s): bogus, zz"),
        ({"jobs": [], "extra": 1}, "unknown field(s): extra"),
        ({"jobs": [{"type": "t", "job_id": "x"}]}, "job #0: unknown field(s): job_id"),
        ({"payload": 1}, "type is required"),
        ({"type": "bad type!"}, "invalid job type"),
        ({"type": "t", "queue": "no/slash"}, "invalid queue name"),
        ({"type": "t", "delay": "3x"}, "delay: invalid duration"),
        ({"type": "t", "delay": -1}, "delay: duration must not be negative"),
        ({"type": "t", "timeout": [1]}, "timeout must be a duration"),
        ({"type": "t", "delay": 1, "run_at": 2}, "delay or run_at, not both"),
        ({"type": "t", "run_at": "2026-01-01T00:00:00"}, "run_at must be"),
        ({"type": "t", "run_at": "tomorrow"}, "run_at must be"),
        ({"type": "t", "run_at": 10**400}, "run_at must be"),
        ({"type": "t", "run_at": 1e300}, "run_at must be a finite number of seconds"),
        ({"type": "t", "delay": 10**400}, "delay:"),
        ({"type": "t", "max_attempts": True}, "max_attempts must not be true or false"),
        ({"type": "t", "max_attempts": 1.5}, "max_attempts must be a positive integer"),
        ({"type": "t", "unique_key": "k"}, "unique_key needs unique_for"),
        ({"type": "t", "traceparent": "nope"}, "traceparent"),
        ({"type": "t", "meta": {"n": 1}}, "meta must be a mapping of strings"),
        ({"type": "t", "payload": 1, "payload_base64": "AA=="}, "payload or payload_base64, not both"),
        ({"type": "t", "payload_base64": "not base64!"}, "payload_base64 is not a base64 string"),
        ({"type": "t", "payload_base64": 7}, "payload_base64 is not a base64 string"),
        ({"type": "t", "payload": "x", "content_type": "text/plain"}, "needs payload_base64"),
        ({"type": "t", "payload_base64": "AA==", "content_type": "a/b\r\nX-Evil: 1"}, "content_type must be"),
    ]
    for body, message in cases:
        reply = await api.enqueue(body)
        assert reply.status == 400, (body, reply.body)
        assert message in reply.body["error"], (body, reply.body)
        assert set(reply.body) == {"error"}
    bad_queue = await api.get("some-id", queue="no/slash")
    assert bad_queue.status == 400
    assert "invalid queue name" in bad_queue.body["error"]
    assert job_keys(r, namespace) == []

    # aiohttp's own errors are JSON too.
    unknown = await api.call("GET", "/v1/nothing")
    assert (unknown.status, unknown.body) == (404, {"error": "not found"})
    wrong_method = await api.call("PUT", "/v1/jobs")
    assert (wrong_method.status, wrong_method.body) == (405, {"error": "method not allowed"})
    assert "POST" in wrong_method.headers["Allow"]


async def test_limits_are_413(api: Api, namespace: str, r: redis.Redis) -> None:
    over = await api.enqueue({"type": "t", "payload": "x" * MAX_PAYLOAD})  # + 2 quotes once encoded
    assert over.status == 413, over.body
    assert f"over the limit of {MAX_PAYLOAD} bytes" in over.body["error"], over.body
    raw = base64.b64encode(b"\x00" * (MAX_PAYLOAD + 1)).decode()
    assert (await api.enqueue({"type": "t", "payload_base64": raw})).status == 413
    in_batch = await api.enqueue({"jobs": [{"type": "t"}, {"type": "t", "payload": "y" * MAX_PAYLOAD}]})
    assert in_batch.status == 413, in_batch.body
    assert in_batch.body["error"].startswith("job #1: payload is"), in_batch.body

    huge_body = await api.enqueue({"type": "t", "payload": "z" * (2 * MAX_PAYLOAD + 64 * 1024)})
    assert huge_body.status == 413
    assert "error" in huge_body.body
    too_many = await api.enqueue({"jobs": [{"type": "t"}] * (MAX_BATCH_JOBS + 1)})
    assert too_many.status == 413
    assert f"at most {MAX_BATCH_JOBS} jobs" in too_many.body["error"]
    assert job_keys(r, namespace) == []

    most = await api.enqueue({"jobs": [{"type": "t", "payload": n} for n in range(MAX_BATCH_JOBS)]})
    assert most.status == 201
    assert len(most.body["jobs"]) == MAX_BATCH_JOBS
    just_fits = await api.enqueue({"type": "t", "payload": "x" * (MAX_PAYLOAD - 2)})
    assert just_fits.status == 201


async def test_the_token_guards_every_route_but_the_probes(api: Api) -> None:
    job_id = (await api.enqueue({"type": "t", "id": "guarded"})).body["id"]
    routes: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/jobs", {"json": {"type": "t", "id": "sneaky"}}),
        ("GET", f"/v1/jobs/{job_id}", {}),
        ("DELETE", f"/v1/jobs/{job_id}", {}),
        ("POST", "/v1/drain", {}),
        ("GET", "/v1/limits", {}),
    ]
    wrong = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN},
             {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer é"}]  # fmt: skip
    for method, path, kwargs in routes:
        for headers in wrong:
            reply = await api.call(method, path, anon=True, headers=headers, **kwargs)
            assert (reply.status, reply.body) == (401, {"error": "missing or wrong bearer token"}), (path, headers)
            assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert api.probe.drains == 0
    assert (await api.get("sneaky")).status == 404
    assert (await api.get(job_id)).body["state"] == "pending"  # not canceled
    lower = await api.call("GET", f"/v1/jobs/{job_id}", anon=True, headers={"Authorization": f"bearer {TOKEN}"})
    assert lower.status == 200


async def test_without_a_token_the_routes_are_open(redis_server: RedisServer, namespace: str) -> None:
    async with running_api(redis_server.url, namespace, token=None) as api:
        created = await api.call("POST", "/v1/jobs", anon=True, json={"type": "t"})
        assert created.status == 201
        assert (await api.call("GET", f"/v1/jobs/{created.body['id']}", anon=True)).status == 200
        assert (await api.call("POST", "/v1/drain", anon=True)).status == 202


# -- web pages: cross-site requests, DNS rebinding, content types (ADR 0009) ----------------------------------
# A browser sends what a page's script asks for, with the page's Origin and Sec-Fetch-Site, and the Host of the
# URL it was given: these are the requests a hostile page can make to a daemon on the visitor's loopback.

EVIL_ORIGIN = "http://evil.example"
SECRET_PAYLOAD = "payload-a-web-page-must-not-read"


@pytest.fixture
async def open_api(redis_server: RedisServer, namespace: str) -> AsyncIterator[Api]:
    """The listener as shipped: loopback, no token."""
    async with running_api(redis_server.url, namespace, token=None) as running:
        yield running


async def test_a_web_pages_text_plain_post_enqueues_nothing(open_api: Api, namespace: str, r: redis.Redis) -> None:
    """fetch(url, {method: "POST", mode: "no-cors", body: JSON.stringify(job)}) sends text/plain, which needs no
    preflight; an HTML form sends a urlencoded or multipart body. None of them may enqueue."""
    body = json.dumps({"type": "t", "payload": SECRET_PAYLOAD}).encode()
    as_a_browser_sends_it = {"Origin": EVIL_ORIGIN, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    for headers in (
        {**as_a_browser_sends_it, "Content-Type": "text/plain;charset=UTF-8"},
        {"Origin": EVIL_ORIGIN, "Content-Type": "text/plain"},  # a browser without Sec-Fetch-*
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},  # one that sent no Origin
        {**as_a_browser_sends_it, "Content-Type": "application/x-www-form-urlencoded"},
        {**as_a_browser_sends_it, "Content-Type": "multipart/form-data; boundary=x"},
    ):
        reply = await open_api.call("POST", "/v1/jobs", anon=True, data=body, headers=headers)
        assert reply.status == 403, (headers, reply.body)
        assert "another site" in reply.body["error"], reply.body
    assert job_keys(r, namespace) == []


async def test_a_json_route_takes_only_json(open_api: Api, namespace: str, r: redis.Redis) -> None:
    """Even with no browser header at all, POST /v1/jobs needs Content-Type: application/json: a type a page can
    only send after a CORS preflight, which jobcar never grants."""
    body = json.dumps({"type": "t", "payload": SECRET_PAYLOAD}).encode()
    for content_type in ("text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x", "application/json; charset=latin-1",
                         "application/jsonx", "text/json", None):  # fmt: skip
        # aiohttp would add application/octet-stream to a body without a type: skip_auto_headers sends none.
        headers, skip = ({"Content-Type": content_type}, ()) if content_type else ({}, ("Content-Type",))
        reply = await open_api.call("POST", "/v1/jobs", anon=True, data=body, headers=headers, skip_auto_headers=skip)
        assert reply.status == 415, (content_type, reply.body)
        assert "application/json" in reply.body["error"], reply.body
    assert job_keys(r, namespace) == []
    # A preflight for application/json is never granted: no Access-Control-Allow-* header, ever.
    preflight = {"Origin": EVIL_ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}  # fmt: skip
    for method, path in (("OPTIONS", "/v1/jobs"), ("OPTIONS", "/v1/drain"), ("POST", "/v1/jobs")):
        reply = await open_api.call(method, path, anon=True, headers=preflight, json={"type": "t"})
        assert reply.status >= 400, (method, path, reply.body)
        assert not [name for name in reply.headers if name.lower().startswith("access-control-")], reply.headers
    assert job_keys(r, namespace) == []
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON; Charset=UTF-8"):
        headers = {"Content-Type": content_type}
        created = await open_api.call("POST", "/v1/jobs", anon=True, data=body, headers=headers)
        assert created.status == 201, (content_type, created.body)


async def test_a_rebound_host_name_reaches_no_route(open_api: Api, namespace: str, r: redis.Redis) -> None:
    """DNS rebinding: evil.example first resolves to the attacker, then to 127.0.0.1. The page is then same-origin
    with the daemon as far as the browser knows, so it may read what it asks for; only Host tells."""
    job_id = (await open_api.enqueue({"type": "t", "id": "kept", "payload": SECRET_PAYLOAD})).body["id"]
    rebound = f"evil.example:{open_api.port}"
    as_the_page_sends_it = {"Host": rebound, "Origin": f"http://{rebound}", "Sec-Fetch-Site": "same-origin"}
    lookalikes = [f"127.0.0.1.nip.io:{open_api.port}", f"localhost.evil.example:{open_api.port}", "EVIL.example"]
    for headers in ({"Host": rebound}, as_the_page_sends_it, *({"Host": name} for name in lookalikes)):
        requests: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/v1/jobs", {"json": {"type": "t", "id": "rebound", "payload": SECRET_PAYLOAD}}),
            ("GET", f"/v1/jobs/{job_id}", {}),
            ("GET", f"/v1/jobs/{job_id}?wait=1s", {}),
            ("DELETE", f"/v1/jobs/{job_id}", {}),
            ("POST", "/v1/drain", {}),
            ("GET", "/metrics", {}),
            ("GET", "/readyz", {}),
        ]
        for method, path, kwargs in requests:
            async with open_api.anon.request(method, path, headers=headers, **kwargs) as response:
                raw = await response.read()
            assert response.status == 421, (method, path, headers, raw)
            assert SECRET_PAYLOAD.encode() not in raw
            assert json.loads(raw)["error"].startswith("this daemon does not answer to the host name"), raw
    assert open_api.probe.drains == 0
    assert (await open_api.get(job_id)).body["state"] == "pending"  # not canceled
    assert (await open_api.get("rebound")).status == 404  # not enqueued


async def test_a_foreign_origin_cannot_drain(open_api: Api) -> None:
    for headers in ({"Origin": EVIL_ORIGIN}, {"Origin": "null"}, {"Origin": f"http://localhost:{open_api.port + 1}"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):  # fmt: skip
        reply = await open_api.call("POST", "/v1/drain", anon=True, headers=headers)
        assert reply.status == 403, (headers, reply.body)
    assert open_api.probe.drains == 0
    assert (await open_api.call("GET", "/healthz", anon=True)).status == 200
    assert (await open_api.enqueue({"type": "t"})).status == 201


@pytest.mark.parametrize("site", ["cross-site", "same-site", "something-new"])
async def test_sec_fetch_site_from_another_site_is_refused_on_every_route(
    open_api: Api, namespace: str, r: redis.Redis, site: str
) -> None:
    """same-site is refused too: a page on localhost:3000 is "same-site" with localhost:9321."""
    job_id = (await open_api.enqueue({"type": "t", "payload": SECRET_PAYLOAD})).body["id"]
    before = job_keys(r, namespace)
    headers = {"Sec-Fetch-Site": site}
    for method, path, kwargs in (("POST", "/v1/jobs", {"json": {"type": "t"}}), ("GET", f"/v1/jobs/{job_id}", {}),
                                 ("DELETE", f"/v1/jobs/{job_id}", {}), ("POST", "/v1/drain", {})):  # fmt: skip
        async with open_api.anon.request(method, path, headers=headers, **kwargs) as response:
            raw = await response.read()
        assert response.status == 403, (method, path, raw)
        assert SECRET_PAYLOAD.encode() not in raw
    assert job_keys(r, namespace) == before
    assert open_api.probe.drains == 0


async def test_clients_that_are_not_web_pages_still_get_in(redis_server: RedisServer, namespace: str) -> None:
    """Producers (no Origin), a user typing a URL (Sec-Fetch-Site: none), same-origin requests, loopback names,
    IP addresses (a kubelet probes and Prometheus scrapes Host: <pod-ip>:port) and the configured names."""
    async with running_api(redis_server.url, namespace, token=None, api_allowed_hosts=("jobcar.internal",)) as api:
        port = api.port
        good_hosts = [f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"LocalHost:{port}", f"[::1]:{port}",
                      f"app.localhost:{port}", f"10.1.2.3:{port}", f"[fd00::5]:{port}", f"jobcar.internal:{port}",
                      "JOBCAR.internal"]  # fmt: skip
        for host in good_hosts:
            for path in ("/healthz", "/readyz", "/metrics"):
                async with api.anon.get(path, headers={"Host": host}) as response:
                    assert response.status == 200, (host, path, await response.read())
            created = await api.call("POST", "/v1/jobs", anon=True, headers={"Host": host}, json={"type": "t"})
            assert created.status == 201, (host, created.body)
            read = await api.call("GET", f"/v1/jobs/{created.body['id']}", anon=True, headers={"Host": host})
            assert read.status == 200, (host, read.body)
        same_origin = [{"Origin": f"http://127.0.0.1:{port}"}, {"Origin": f"http://127.0.0.1:{port}",
                       "Sec-Fetch-Site": "same-origin"}, {"Host": f"jobcar.internal:{port}",
                       "Origin": f"http://jobcar.internal:{port}"}, {"Sec-Fetch-Site": "none"}]  # fmt: skip
        for headers in same_origin:
            created = await api.call("POST", "/v1/jobs", anon=True, headers=headers, json={"type": "t"})
            assert created.status == 201, (headers, created.body)
            canceled = await api.call("DELETE", f"/v1/jobs/{created.body['id']}", anon=True, headers=headers)
            assert canceled.status == 200, (headers, canceled.body)
        drain = await api.call("POST", "/v1/drain", anon=True, headers={"Origin": f"http://127.0.0.1:{port}"})
        assert drain.status == 202
        assert api.probe.drains == 1
        # A listed name is only that name: not its subdomains, not a name that ends like it.
        for host in (f"x.jobcar.internal:{port}", f"evil-jobcar.internal:{port}"):
            refused = await api.call("POST", "/v1/jobs", anon=True, headers={"Host": host}, json={"type": "t"})
            assert refused.status == 421, (host, refused.body)


async def test_with_a_token_any_host_name_is_answered_but_no_web_page(api: Api, namespace: str, r: redis.Redis) -> None:
    """A browser never sends a bearer token on its own, so with api_token a rebound name gains a page nothing, and
    the names by which other pods reach the daemon (a Service's) need not be listed. Web pages are refused still."""
    service = f"jobcar.default.svc.cluster.local:{api.port}"
    created = await api.call("POST", "/v1/jobs", headers={"Host": service}, json={"type": "t"})
    assert created.status == 201, created.body
    anonymous = await api.call("POST", "/v1/jobs", anon=True, headers={"Host": service}, json={"type": "t"})
    assert anonymous.status == 401
    keys = job_keys(r, namespace)
    for headers in ({"Origin": EVIL_ORIGIN}, {"Sec-Fetch-Site": "cross-site"}):
        refused = await api.call("POST", "/v1/jobs", headers=headers, json={"type": "t"})
        assert refused.status == 403, (headers, refused.body)
        drain = await api.call("POST", "/v1/drain", headers=headers)
        assert drain.status == 403, (headers, drain.body)
    text = await api.call("POST", "/v1/jobs", data=b'{"type": "t"}', headers={"Content-Type": "text/plain"})
    assert text.status == 415
    assert job_keys(r, namespace) == keys
    assert api.probe.drains == 0


def test_a_web_page_cannot_drain_a_running_daemon(start_daemon: StartDaemon, q: QueueDriver) -> None:
    """`jobcar run` as shipped (loopback, no token): a page's drain is refused, and the daemon goes on leasing."""
    listen = f"127.0.0.1:{free_port()}"
    daemon = start_daemon({"t.ok": {"command": ["true"]}}, listen=listen, result_ttl="60s")

    port = listen.rpartition(":")[2]
    for headers in ({"Origin": EVIL_ORIGIN, "Sec-Fetch-Site": "cross-site"}, {"Host": f"evil.example:{port}"}):
        status, answer = post(f"http://{listen}/v1/drain", b"", headers)
        assert status in (403, 421), (headers, status, answer)
    status, answer = post(f"http://{listen}/v1/jobs", b'{"type": "t.ok"}', {"Content-Type": "application/json"})
    assert status == 201, answer
    wait_for(lambda: q.where(answer["id"]) is State.DONE, what="the job enqueued after the refused drains to run")
    assert daemon.process is not None
    assert daemon.process.poll() is None
    messages = [str(line.get("msg", "")) for line in daemon.lines()]
    assert "POST /v1/drain refused: sent by a browser for another site" in messages, daemon.log_tail()
    assert not [message for message in messages if "drain requested" in message], daemon.log_tail()


# -- cancel ---------------------------------------------------------------------------------------------------


async def test_cancel_in_every_state(api: Api, namespace: str, r: redis.Redis) -> None:
    pending = (await api.enqueue({"type": "t", "unique_for": "1h", "unique_key": "once"})).body["id"]
    reply = await api.cancel(pending)
    assert (reply.status, reply.body) == (
        200, {"id": pending, "queue": "default", "result": "canceled", "state": "canceled"})  # fmt: skip
    assert (await api.get(pending)).status == 404
    assert QueueDriver(r, namespace).where(pending) is None
    again = await api.enqueue({"type": "t", "unique_for": "1h", "unique_key": "once"})
    assert again.status == 201, "cancel releases the unique lock"

    scheduled = (await api.enqueue({"type": "t", "queue": "later", "delay": "1h"})).body["id"]
    reply = await api.cancel(scheduled, queue="later")
    assert (reply.status, reply.body["result"]) == (200, "canceled")

    # Active: leased through the store, as a daemon would. The daemon running it stops it.
    work = QueueDriver(r, namespace, "work")
    active = (await api.enqueue({"type": "t", "queue": "work"})).body["id"]
    leased = work.lease_one()
    assert leased.job.id == active
    reply = await api.cancel(active)
    assert (reply.status, reply.body) == (
        200, {"id": active, "queue": "work", "result": "cancel_requested", "state": "active"})  # fmt: skip
    shown = (await api.get(active)).body
    assert (shown["state"], shown["cancel_requested"], shown["attempt"]) == ("active", True, 1)
    assert shown["started_at"] is not None

    # Dead: already finished, nothing changes.
    doomed = (await api.enqueue({"type": "t", "queue": "work"})).body["id"]
    assert work.kill(doomed, work.lease_one().token, reason="handler said no") == 1
    reply = await api.cancel(doomed)
    assert (reply.status, reply.body) == (
        409, {"error": "job already finished", "id": doomed, "queue": "work", "state": "dead"})  # fmt: skip
    assert work.where(doomed) is State.DEAD

    missing = await api.cancel("no-such-job")
    assert (missing.status, missing.body) == (404, {"error": "no such job"})
    assert (await api.cancel(active, queue="default")).status == 404


async def test_a_retried_job_shows_its_errors(api: Api, namespace: str, r: redis.Redis) -> None:
    job_id = (await api.enqueue({"type": "t", "max_attempts": 3})).body["id"]
    driver = QueueDriver(r, namespace)
    assert driver.retry(job_id, driver.lease_one().token, delay_ms=60_000, error="HTTP 503 from handler") == 1
    job = (await api.get(job_id)).body
    assert (job["state"], job["attempt"], job["max_attempts"]) == ("scheduled", 1, 3)
    [error] = job["errors"]
    assert (error["attempt"], error["error"]) == (1, "HTTP 503 from handler")
    assert abs(time_of(error["at"]) - time.time()) < 60
    assert time_of(job["run_at"]) > time.time() + 30


async def test_the_document_shows_what_the_handler_wrote(api: Api, namespace: str, r: redis.Redis) -> None:
    driver = QueueDriver(r, namespace)
    job_id = (await api.enqueue({"type": "t", "id": "parent"})).body["id"]
    leased = driver.lease_one()
    talk_back(
        Client(r, namespace=namespace), leased, percent=100, message="<b>done</b>", lines=("a", "b", "c"),
        max_lines=1, steps={"s1": b"\x00" * 10}, children=(("other", "kid"),),
    )  # fmt: skip
    job = (await api.get(job_id)).body
    assert job["progress"]["percent"] == 100
    assert job["progress"]["message"] == "<b>done</b>"
    assert job["progress"]["attempt"] == 1
    assert abs(time_of(job["progress"]["at"]) - time.time()) < 60
    assert job["log"] == {"lines": 1, "dropped": 2}
    [step] = job["steps"]
    assert (step["name"], step["bytes"]) == ("s1", 10)
    assert abs(time_of(step["at"]) - time.time()) < 60
    assert [(c["ref"], c["state"]) for c in job["children"]] == [("other/kid", "pending")]
    assert (job["children_total"], job["parent"]) == (1, None)
    assert "lease_token" not in job
    assert leased.token not in json.dumps(job)
    child = (await api.get("kid", "other")).body
    assert (child["parent"], child["progress"], child["children"], child["children_total"]) == (
        "default/parent",
        None,
        [],
        0,
    )


# -- Redis refusing writes --------------------------------------------------------------------------------------


def fill_past_maxmemory(server: RedisServer) -> None:
    """Put the server out of memory under noeviction: 8 MiB of data, then a maxmemory 4 MiB below what it uses.

    (Writing up to the limit is not enough: a refused command's own buffer is freed with it, and the next
    small write fits again.)"""
    with server.client() as c:
        for n in range(128):
            c.set(f"filler:{n}", b"x" * 64 * 1024)
        c.config_set("maxmemory", int(c.info("memory")["used_memory"]) - 4 * 1024 * 1024)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.set("one-more", "x")


async def test_redis_refusing_writes_is_503_and_nothing_is_half_written(tmp_path: Path, namespace: str) -> None:
    server = RedisServer(find_server_binary(), tmp_path / "oom").start()
    c = server.client()
    default, fresh = QueueDriver(c, namespace), QueueDriver(c, namespace, "fresh")
    try:
        async with running_api(server.url, namespace) as api:
            first = await api.enqueue({"type": "t", "id": "before"})  # the client now knows queue "default"
            assert first.status == 201
            fill_past_maxmemory(server)
            before = default.snapshot()
            job = {"type": "t", "id": "during", "unique_for": "1h", "unique_key": "k", "payload": {"n": 1}}
            for body in (job, {"jobs": [job, {"type": "t", "delay": 5}]}, {"type": "t", "queue": "fresh"}):
                reply = await api.enqueue(body)
                assert reply.status == 503, reply.body
                assert reply.body["error"].startswith("redis unavailable: OutOfMemoryError"), reply.body
            assert default.snapshot() == before
            assert fresh.snapshot() == {}
            assert not c.exists(default.keys.job("during"), default.keys.unique("k"))
            assert b"fresh" not in c.smembers(queues_key(namespace))

            # Reads still answer, and cancel (allow-oom) frees what an operator wants gone.
            assert (await api.get("before")).status == 200
            assert (await api.cancel("before")).body["result"] == "canceled"

            c.config_set("maxmemory", 0)
            again = await api.enqueue(job)
            assert (again.status, again.body["id"]) == (201, "during")
            assert default.where("during") is State.PENDING
            assert c.get(default.keys.unique("k")) == b"during"
    finally:
        c.close()
        server.stop()


async def test_unreachable_redis_is_503_without_secrets_in_answers_or_logs(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://jobcar:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    secret_payload = "top-secret-payload"

    with caplog.at_level(logging.DEBUG):
        async with running_api(url, namespace) as api:
            replies = [
                await api.enqueue({"type": "t", "payload": secret_payload}),
                await api.get("some-job"),
                await api.cancel("some-job"),
                await api.call("POST", "/v1/jobs", anon=True, headers={"Authorization": "Bearer guessed"}, json={}),
            ]
            assert [reply.status for reply in replies] == [503, 503, 503, 401]
            for reply in replies[:3]:
                assert reply.body["error"].startswith("redis unavailable: ConnectionError"), reply.body
            assert "hunter2" not in json.dumps([reply.body for reply in replies])
            assert (await api.call("GET", "/healthz", anon=True)).status == 200
    assert any("redis unavailable" in record.getMessage() for record in caplog.records)
    for secret in ("hunter2", TOKEN, secret_payload, "guessed"):
        assert secret not in caplog.text
    assert redact("cannot reach redis://jobcar:hunter2@db:6379/0 or rediss://:pw@x") == (
        "cannot reach redis://***@db:6379/0 or rediss://***@x"
    )


# -- exposure -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:9321", True),
        ("127.8.9.10:0", True),
        ("[::1]:9321", True),
        ("localhost:9321", True),
        ("LOCALHOST:1", True),
        ("0.0.0.0:9321", False),
        ("[::]:9321", False),
        ("10.1.2.3:9321", False),
        ("example.com:9321", False),
        ("localhost", False),  # no port: not a listen address at all
        ("::1:9321", False),  # an IPv6 address needs brackets
    ],
)
def test_is_loopback_and_check_exposure(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback
    open_config = Config(source="jobcar.yaml", listen=listen)
    problem = check_exposure(open_config)
    if loopback:
        assert problem is None
    else:
        assert problem is not None
        assert "jobcar.yaml" in problem
        assert listen in problem
        assert "api_token" in problem
    assert check_exposure(Config(source="jobcar.yaml", listen=listen, api_token="s3cret")) is None


async def test_the_client_must_share_the_configured_payload_limit(redis_server: RedisServer, namespace: str) -> None:
    config = Config(source="test.yaml", namespace=namespace, max_payload_bytes=MAX_PAYLOAD)
    async with AsyncClient.from_url(redis_server.url, namespace=namespace) as client:
        probe = Probe()

        async def metrics() -> bytes:
            return b""

        context = ApiContext(config, client, probe.readiness, probe.drain, metrics)
        with pytest.raises(ValueError, match="max_payload_bytes"):
            build_app(context)


async def test_limits_lists_each_group_with_its_rule(redis_server: RedisServer, namespace: str) -> None:
    limits = Limits(concurrency=1, rate=Rate(2, 1.0))
    handler = HttpHandler(type="a", url="http://127.0.0.1:9/", timeout=1.0, max_attempts=3, backoff=Backoff(),
                          max_retry_after=1.0, limits=limits)  # fmt: skip
    async with running_api(redis_server.url, namespace, handlers={"a": handler}) as api:
        assert (await api.call("GET", "/v1/limits")).body == []
        with redis_server.client() as r:
            q = QueueDriver(r, namespace)
            for n in range(2):
                q.enqueue("a", n)
            assert len(q.lease(limits='{"a": {"total": 1, "rate": [2, 1000], "burst": 1}}').jobs) == 1
        reply = await api.call("GET", "/v1/limits")
    assert reply.status == 200
    by_group = {g["group"]: g for g in reply.body}
    assert by_group["a"] == {"queue": "default", "group": "a", "kind": "concurrency", "running": 1, "held": 1,
                             "limit": "1", "next_start_in_ms": None}  # fmt: skip
    assert (by_group["@a"]["kind"], by_group["@a"]["limit"], by_group["@a"]["held"]) == ("rate", "2/1000ms", 0)
    assert 0 < by_group["@a"]["next_start_in_ms"] <= 500


async def test_limits_counts_a_keys_slots_apart_from_its_types(redis_server: RedisServer, namespace: str) -> None:
    def limited(job_type: str, limits: Limits) -> HttpHandler:
        return HttpHandler(type=job_type, url="http://127.0.0.1:9/", timeout=1.0, max_attempts=3, backoff=Backoff(),
                           max_retry_after=1.0, limits=limits)  # fmt: skip

    handlers = {"a": limited("a", Limits(concurrency=3, per_key=1)), "b": limited("b", Limits(per_key=1))}
    async with running_api(redis_server.url, namespace, handlers=handlers) as api:
        with redis_server.client() as r:
            q = QueueDriver(r, namespace)
            for job_type in ("a", "b"):
                for key in ("k1", "k1", "k2"):
                    q.enqueue(job_type, key=key)
            rules = '{"a": {"total": 3, "per_key": 1}, "b": {"per_key": 1}}'
            assert len(q.lease(limits=rules).jobs) == 4
        reply = await api.call("GET", "/v1/limits")
    counts = {g["group"]: (g["running"], g["held"], g["limit"]) for g in reply.body}
    assert counts == {"a": (2, 0, "3"), "a#k1": (1, 1, "1"), "a#k2": (1, 0, "1"), "b#k1": (1, 1, "1"),
                      "b#k2": (1, 0, "1")}, "a type without a total of its own shows only its keys"  # fmt: skip
