"""The daemon's HTTP listener (jobcar.api) on 127.0.0.1, driven by a real aiohttp client against real Redis:
every route, the bearer token, bad input, limits, and Redis refusing writes (guarantees 8, 12, 15 of
docs/delivery-semantics.md)."""

from __future__ import annotations

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
    MAX_BATCH_JOBS,
    METRICS_CONTENT_TYPE,
    ApiContext,
    bound_port,
    build_app,
    check_exposure,
    start_listener,
)
from jobcar.client import AsyncClient
from jobcar.config_types import Config
from jobcar.formats import redact
from jobcar.job import State
from jobcar.keys import queues_key
from jobcar.listen import is_loopback
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, find_server_binary, free_port

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
    redis_url: str, namespace: str, *, token: str | None = TOKEN, max_payload_bytes: int = MAX_PAYLOAD
) -> AsyncIterator[Api]:
    """The listener on 127.0.0.1, port 0, with a real AsyncClient; everything closed on exit."""
    config = Config(
        source="test.yaml",
        namespace=namespace,
        listen="127.0.0.1:0",
        api_token=token,
        max_payload_bytes=max_payload_bytes,
    )
    client = AsyncClient.from_url(redis_url, namespace=namespace, max_payload_bytes=max_payload_bytes)
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
                yield Api(http, anon, client, probe)
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
