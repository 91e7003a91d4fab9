"""The handler API's routes in process: the daemon's listener (api.py) on the session's server, with an attempt
opened on the desk for a job leased through the real lease script, as the runner opens one. What each route
refuses, and how, without a handler process (test_handler_api.py runs real handlers under a real daemon).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import redis

from jobcar.api import ApiContext, bound_port, build_app, start_listener
from jobcar.attempt_desk import AttemptDesk, LiveAttempt
from jobcar.client import AsyncClient
from jobcar.config_types import Config
from jobcar.outcome import Outcome
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer


@dataclass
class Attempt:
    http: aiohttp.ClientSession
    live: LiveAttempt
    answers: list[Outcome]

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.live.token}", **kwargs.pop("headers", {})}
        async with self.http.request(method, self.live.url + path, headers=headers, **kwargs) as response:
            return response.status, await response.json(content_type=None)


@contextlib.asynccontextmanager
async def attempt_of(redis_url: str, q: QueueDriver, **settings: Any) -> AsyncIterator[Attempt]:
    """A listener, and a leased job's attempt open on its desk (as Attempts opens one)."""
    config = Config(source="test.yaml", namespace=q.keys.namespace, listen="127.0.0.1:0", **settings)
    client = AsyncClient.from_url(redis_url, namespace=config.namespace)
    desk = AttemptDesk()

    async def ready() -> tuple[bool, str]:
        return True, "ready"

    async def metrics() -> bytes:
        return b""

    context = ApiContext(config, client, ready, lambda: None, metrics, desk)
    runner = await start_listener(build_app(context), config.listen)
    desk.base_url = f"http://127.0.0.1:{bound_port(runner)}"
    q.enqueue("t", {"n": 1})
    leased = q.lease_one()
    answers: list[Outcome] = []

    async def answer_now(live: LiveAttempt, outcome: Outcome) -> bool:
        answers.append(outcome)
        return True

    desk.answer_now = answer_now
    live = LiveAttempt(leased, q.keys)
    desk.open(live, deadline=time.time() + 60, latest=time.time() + 60)
    desk.running = {(q.keys.queue, leased.job.id): live}
    try:
        async with aiohttp.ClientSession() as http:
            yield Attempt(http, live, answers)
    finally:
        await runner.cleanup()
        await client.close()


async def test_bad_input_is_a_400_naming_the_problem(redis_server: RedisServer, q: QueueDriver) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        for path, body, words in (
            ("/progress", {"percent": 101}, "percent must be a number from 0 to 100"),
            ("/progress", {"percent": True}, "percent must be a number"),
            ("/progress", {}, "give percent"),
            ("/progress", {"percent": 5, "eta": 3}, "unknown field(s): eta"),
            ("/log", {"lines": "one"}, 'give {"line": "..."}'),
            ("/extend", {"by": "soon"}, "by:"),
            ("/snooze", {"delay": -1}, "delay:"),
            ("/await-children", {"on_child_failure": "ignore"}, "on_child_failure must be one of fail, run, cancel"),
        ):
            status, answer = await attempt.call("POST", path, json=body)
            assert (status, words in answer["error"]) == (400, True), (path, answer)
        assert attempt.answers == []


async def test_waiting_for_children_that_may_fail_needs_kept_results(redis_server: RedisServer, q: QueueDriver) -> None:
    async with attempt_of(redis_server.url, q) as attempt:  # result_ttl 0: a child that succeeded is deleted
        status, answer = await attempt.call("POST", "/await-children", json={"on_child_failure": "fail"})
        assert status == 400
        assert "needs result_ttl above 0" in answer["error"]
        status, answer = await attempt.call("POST", "/await-children", json={})
        assert (status, answer["error"]) == (409, "no children")
        assert not attempt.live.answered  # refused: the attempt's own answer still counts


async def test_a_text_body_logs_one_line_each(redis_server: RedisServer, q: QueueDriver, r: redis.Redis) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        body = "first\n\nsecond\n" + "x" * 5000
        status, answer = await attempt.call("POST", "/log", data=body, headers={"Content-Type": "text/plain"})
        assert (status, answer) == (200, {"lines": 3, "dropped": 0})
        kept = r.lrange(q.keys.log(attempt.live.job.id), 0, -1)
        assert len(kept[2]) < 4200  # cut to max_line_bytes (4096), marked


async def test_snooze_answers_the_attempt_once(redis_server: RedisServer, q: QueueDriver) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        status, answer = await attempt.call("POST", "/snooze", json={"delay": "2h"})
        assert (status, answer) == (202, {"status": "snoozed", "delay": 3600.0})  # capped at max_retry_after
        assert attempt.answers == [Outcome.snooze(3600.0)]
        status, answer = await attempt.call("POST", "/progress", json={"percent": 1})
        assert (status, answer["error"]) == (409, "the attempt already answered")


async def test_steps_read_back_and_list(redis_server: RedisServer, q: QueueDriver) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        assert (await attempt.call("PUT", "/steps/fetch", data=b"\x00\xffbytes"))[0] == 201
        async with attempt.http.get(attempt.live.url + "/steps/fetch",
                                    headers={"Authorization": f"Bearer {attempt.live.token}"}) as response:  # fmt: skip
            assert (response.status, await response.read()) == (200, b"\x00\xffbytes")
        status, listing = await attempt.call("GET", "/steps")
        assert status == 200
        assert listing["fetch"]["size"] == 7
        assert (await attempt.call("GET", "/steps/other"))[0] == 404


@pytest.mark.parametrize("token", ["", "wrong", "Ωmega"])
async def test_a_wrong_token_is_a_401(redis_server: RedisServer, q: QueueDriver, token: str) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with attempt.http.post(attempt.live.url + "/progress", json={"percent": 1}, headers=headers) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_a_child_refused_by_max_pending_is_no_child(
    redis_server: RedisServer, q: QueueDriver, r: redis.Redis
) -> None:
    async with attempt_of(redis_server.url, q) as attempt:
        r.hset(q.keys.settings, "max_pending", 1)  # as the daemons write their config's max_pending
        status, answer = await attempt.call("POST", "/children", json={"jobs": [
            {"type": "c", "id": "kid-1", "payload": {}}, {"type": "c", "id": "kid-2", "payload": {}}]})  # fmt: skip
        assert status == 429
        assert answer["max_pending"] == 1
        assert r.zrange(q.keys.children(attempt.live.job.id), 0, -1) == []
        status, answer = await attempt.call("POST", "/children", json={"type": "c", "id": "kid-3", "payload": {}})
        assert (status, answer["id"]) == (201, "kid-3")
        assert r.zrange(q.keys.children(attempt.live.job.id), 0, -1) == [b"default/kid-3"]
