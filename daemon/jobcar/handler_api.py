"""The handler API: what a handler may do during its attempt, over plain HTTP to the daemon that runs it
(docs/handler-api.md). Each route is under the attempt's URL, `/v1/attempts/<job id>`, and needs the
attempt's token as `Authorization: Bearer <token>` (attempt_desk.py): the api_token is not asked for, and
does not open these routes.

    GET  .../                    200 the attempt: id, type, queue, attempt, deadline
    POST .../progress            {"percent"?: 0-100, "message"?}: kept with the job (the latest only)
    POST .../log                 {"line"} | {"lines": [...]} | text/plain, one line each: appended to the job's log
    POST .../extend              {"by": "5m"}: the deadline moves to that long from now, within max_extend
    POST .../snooze              {"delay": "30s"}: 202, the job comes back then without spending an attempt
    POST .../children            a job or {"jobs": [...]}, as POST /v1/jobs: 201, enqueued as the job's children
    GET  .../children            200 the children: reference, state
    POST .../await-children      {"on_child_failure"?: "run" | "fail" | "cancel"}: 202, the job waits for its
                                 children and runs again once they all ended, its attempt not spent
    GET  .../steps               200 {name: {"size", "at"}}
    GET  .../steps/{name}        200 the step's result (bytes) | 404
    PUT  .../steps/{name}        the body is the step's result: 201 kept

A refused call says why: 401 (no running attempt of this job holds this token), 409 (the attempt ended,
answered, lost its lease or its job was canceled; a bound reached), 413 (a step too large), 400 (bad input).
Every write is fenced by the attempt's lease in its script (handler_calls.py): a handler whose lease was
lost writes nothing. Snooze and await-children answer the attempt: what the handler returns after them is
not used, and its later calls are refused (409).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeAlias

from aiohttp import hdrs, web

from jobcar.api_fields import duration_field, reject_unknown
from jobcar.attempt_desk import ATTEMPT_PATH, LEASE_LOST, AttemptDesk, LiveAttempt, Refused
from jobcar.attempt_logs import LINES_PER_WRITE, LogWriter
from jobcar.client import AsyncClient
from jobcar.config_types import Config
from jobcar.dependencies import ON_DEPENDENCY_FAILURE
from jobcar.dependency_calls import DependOutcome, depend_call, settle_call
from jobcar.enqueue_request import parse_enqueue_request
from jobcar.errors import InvalidJob, QueueFull
from jobcar.formats import loads_strict
from jobcar.handler_calls import (
    ACCEPTED,
    adopt_call,
    await_children_call,
    now_ms,
    parse_await,
    progress_call,
    progress_document,
    split_step_value,
    step_call,
    step_value,
)
from jobcar.keys import QueueKeys, job_ref, split_job_ref
from jobcar.outcome import Outcome
from jobcar.producer import Producer
from jobcar.recording import dead_letter_limits
from jobcar.records import build_records
from jobcar.replies import as_bytes, as_text
from jobcar.timestamps import rfc3339
from jobcar.transitions import ExtendStatus, extend_call, parse_extend
from jobcar.transport import execute_async, run_async

#: A progress message is one short line.
MAX_MESSAGE_CHARS: Final = 500
#: A step's name: printable, no slash (it is a path segment).
MAX_STEP_NAME: Final = 200
#: Children listed by GET .../children.
MAX_CHILDREN_LISTED: Final = 1000

DESK: Final = web.AppKey("jobcar.handler_api.desk", AttemptDesk)
Route: TypeAlias = Callable[[web.Request, LiveAttempt], Awaitable[web.StreamResponse]]


def is_attempt_route(path: str) -> bool:
    """A request for the handler API, which checks the attempt's token rather than the api_token."""
    return path.startswith(ATTEMPT_PATH)


def add_handler_routes(
    app: web.Application,
    desk: AttemptDesk,
    config: Callable[[web.Request], Config],
    client: Callable[[web.Request], AsyncClient],
) -> None:
    """Serve the handler API on `app` (the daemon's listener)."""
    app[DESK] = desk
    base = ATTEMPT_PATH + "{id}"

    def route(handler: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            try:
                live = desk.find(request.match_info["id"], _bearer(request))
                return await handler(request, live)
            except Refused as exc:
                headers = {"WWW-Authenticate": 'Bearer realm="jobcar attempt"'} if exc.status == 401 else None
                return _error(exc.status, exc.reason, headers)

        return serve

    api = _HandlerApi(desk, config, client)
    app.router.add_get(base, route(api.show))
    app.router.add_post(base + "/progress", route(api.progress))
    app.router.add_post(base + "/log", route(api.log))
    app.router.add_post(base + "/extend", route(api.extend))
    app.router.add_post(base + "/snooze", route(api.snooze))
    app.router.add_post(base + "/children", route(api.add_children))
    app.router.add_get(base + "/children", route(api.children))
    app.router.add_post(base + "/await-children", route(api.await_children))
    app.router.add_get(base + "/steps", route(api.steps))
    app.router.add_get(base + "/steps/{name}", route(api.read_step))
    app.router.add_put(base + "/steps/{name}", route(api.write_step))


def _bearer(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class _HandlerApi:
    def __init__(
        self,
        desk: AttemptDesk,
        config: Callable[[web.Request], Config],
        client: Callable[[web.Request], AsyncClient],
    ) -> None:
        self.desk = desk
        self._config = config
        self._client = client

    # -- reading ----------------------------------------------------------------------------------

    async def show(self, request: web.Request, live: LiveAttempt) -> web.Response:
        job = live.job
        document = {"id": job.id, "type": job.type, "queue": job.queue, "attempt": job.attempt}
        return web.json_response(
            {**document, "deadline": rfc3339(live.deadline), "latest_deadline": rfc3339(live.latest)}
        )

    async def steps(self, request: web.Request, live: LiveAttempt) -> web.Response:
        stored = await self._client(request).redis.hgetall(live.keys.steps(live.job.id))
        listing = {}
        for name, value in stored.items():
            at, result = split_step_value(as_bytes(value))
            listing[as_text(name)] = {"size": len(result), "at": rfc3339(at / 1000)}
        return web.json_response(listing)

    async def read_step(self, request: web.Request, live: LiveAttempt) -> web.Response:
        name = _step_name(request)
        stored = await self._client(request).redis.hget(live.keys.steps(live.job.id), name)
        if stored is None:
            return _error(404, f"no step {name!r} was written")
        at, result = split_step_value(as_bytes(stored))
        return web.Response(body=result, content_type="application/octet-stream",
                            headers={"Jobcar-Step-At": rfc3339(at / 1000)})  # fmt: skip

    async def children(self, request: web.Request, live: LiveAttempt) -> web.Response:
        redis = self._client(request).redis
        refs = [as_text(r) for r in await redis.zrange(live.keys.children(live.job.id), 0, MAX_CHILDREN_LISTED - 1)]
        namespace = live.keys.namespace
        states = []
        for ref in refs:
            queue, child_id = split_job_ref(ref)
            state = await redis.hget(QueueKeys.of(namespace, queue).job(child_id), "state")
            states.append({"ref": ref, "id": child_id, "queue": queue, "state": as_text(state) if state else "gone"})
        return web.json_response({"children": states})

    # -- writing ----------------------------------------------------------------------------------

    async def progress(self, request: web.Request, live: LiveAttempt) -> web.Response:
        body = await _json_object(request)
        reject_unknown(body, {"percent", "message"})
        percent, message = body.get("percent"), body.get("message")
        if percent is None and message is None:
            raise InvalidJob("give percent (0 to 100), message, or both")
        if percent is not None and (isinstance(percent, bool) or not isinstance(percent, int | float)
                                    or not math.isfinite(percent) or not 0 <= percent <= 100):  # fmt: skip
            raise InvalidJob("percent must be a number from 0 to 100")
        if message is not None and (not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS):
            raise InvalidJob(f"message must be text of at most {MAX_MESSAGE_CHARS} characters")
        document = progress_document(live.job.attempt, percent, message)
        await self._write(request, progress_call(live.keys, live.job.id, live.lease_token, document))
        return web.json_response({"status": "ok"})

    async def log(self, request: web.Request, live: LiveAttempt) -> web.Response:
        if request.content_type == "text/plain":
            lines = (await request.text()).splitlines()
        else:
            body = await _json_object(request)
            reject_unknown(body, {"line", "lines"})
            given = [body["line"]] if "line" in body else body.get("lines")
            if not isinstance(given, list) or not all(isinstance(line, str) for line in given):
                raise InvalidJob('give {"line": "..."} or {"lines": ["...", ...]}, or a text/plain body')
            lines = given
        lines = [line for line in lines if line]
        if not lines:
            raise InvalidJob("no line to log")
        if len(lines) > LINES_PER_WRITE:
            raise InvalidJob(f"at most {LINES_PER_WRITE} lines per call")
        writer = LogWriter(self._client(request).redis, self._config(request).handler_api)
        written = await writer.write(live, lines)
        if written.refusal is not None:
            raise Refused(409, _refusal(written.refusal))
        return web.json_response({"lines": written.lines, "dropped": written.dropped})

    async def extend(self, request: web.Request, live: LiveAttempt) -> web.Response:
        body = await _json_object(request)
        reject_unknown(body, {"by"})
        seconds = duration_field("by", body.get("by"))
        config = self._config(request)
        if not live.extendable:
            handler = config.handlers.get(live.job.type)
            if handler is not None and handler.batch is not None:
                why = "a batched job's time is its batch call's"
            elif handler is None or not handler.max_extend:
                why = f"its handler allows none (handlers.{live.job.type}.max_extend is 0)"
            else:
                why = f"the attempt is at its handler's max_extend ({handler.max_extend:g}s)"
            raise Refused(409, f"cannot extend: {why}")
        # The lease is renewed in the same step: a handler that lost it learns so now, and one that asks for
        # more time gets a full lease from now, whatever the heartbeat's phase.
        call = extend_call(live.keys, int(config.lease * 1000), [(live.job.id, live.lease_token)])
        (reply,) = await execute_async(self._client(request).redis, [call])
        (status,) = parse_extend(reply)
        if status is ExtendStatus.LOST:
            raise Refused(409, LEASE_LOST)
        deadline = live.extend(seconds)
        return web.json_response({"deadline": rfc3339(deadline), "latest_deadline": rfc3339(live.latest)})

    async def snooze(self, request: web.Request, live: LiveAttempt) -> web.Response:
        body = await _json_object(request)
        reject_unknown(body, {"delay"})
        delay = duration_field("delay", body.get("delay"))
        config = self._config(request)
        handler = config.handlers.get(live.job.type)
        delay = min(delay, handler.max_retry_after if handler else config.defaults.max_retry_after)
        live.answered = True  # from now on the attempt's own answer is not recorded
        if not await self.desk.answer_now(live, Outcome.snooze(delay)):
            live.answered = False
            raise Refused(409, LEASE_LOST)
        return web.json_response({"status": "snoozed", "delay": delay}, status=202)

    async def add_children(self, request: web.Request, live: LiveAttempt) -> web.Response:
        specs, batch = parse_enqueue_request(await request.read())  # as POST /v1/jobs reads its body
        config, client = self._config(request), self._client(request)
        parent = job_ref(live.job.queue, live.job.id)
        # A child goes to its parent's queue unless it names one.
        specs = [(t, p, {"queue": live.job.queue, **options}) for t, p, options in specs]
        records = build_records(specs, client.max_payload_bytes)
        for record in records:
            record.parent = parent
        refs = [job_ref(r.queue, r.id) for r in records]
        # Recorded with the parent first, fenced by its lease: a handler that lost its lease makes no child.
        await self._write(request, adopt_call(live.keys, live.job.id, live.lease_token, refs,
                                              config.handler_api.max_children))  # fmt: skip
        producer = Producer(client.redis, client.namespace, client.max_payload_bytes)
        try:
            infos = await run_async(client.redis, producer.enqueue(records))
        except QueueFull as exc:
            # A child refused by its queue's max_pending was never stored: it is no child (the 429 says so).
            stored = {job_ref(info.queue, info.id) for info in exc.stored}
            await client.redis.zrem(live.keys.children(live.job.id), *(ref for ref in refs if ref not in stored))
            raise
        documents = [{"id": i.id, "queue": i.queue, "state": i.state.value, "status": i.status.value} for i in infos]
        return web.json_response({"jobs": documents} if batch else documents[0], status=201)

    async def await_children(self, request: web.Request, live: LiveAttempt) -> web.Response:
        body = await _json_object(request, empty_ok=True)
        reject_unknown(body, {"on_child_failure"})
        policy = body.get("on_child_failure", "run")
        # A parent waiting for its children is a job waiting for others: their failure does what a dependency's does.
        if policy not in ON_DEPENDENCY_FAILURE:
            raise InvalidJob(f"on_child_failure must be one of {', '.join(ON_DEPENDENCY_FAILURE)}")
        if policy != "run" and not self._config(request).result_ttl:
            # A child that succeeded is deleted at once: it would read as gone, which counts as a failure.
            raise InvalidJob(f"on_child_failure {policy} needs result_ttl above 0, to tell a child that succeeded "
                             "from one that is gone; with result_ttl 0 only run can be used")  # fmt: skip
        redis = self._client(request).redis
        continuations = await self._continuations(request, live)
        live.answered = True  # from now on the attempt's own answer is not recorded
        try:
            call = await_children_call(live.keys, live.job.id, live.lease_token, policy, continuations)
            (reply,) = await execute_async(redis, [call])
        except BaseException:
            live.answered = False
            raise
        refusal, children = parse_await(reply)
        if refusal is not None:
            live.answered = False
            raise Refused(409, _refusal(refusal))
        # As an enqueue with `after` registers its job: each child tells the parent when it ends, and one that
        # ended already is told to the parent now (ADR 0016).
        parent = job_ref(live.job.queue, live.job.id)
        namespace = live.keys.namespace
        registering = [depend_call(QueueKeys.of(namespace, q), i, parent) for q, i in map(split_job_ref, children)]
        outcomes = [DependOutcome(as_text(r)) for r in await execute_async(redis, registering)]
        dead = dead_letter_limits(self._config(request))
        ended = [(ref, o) for ref, o in zip(children, outcomes, strict=True) if o is not DependOutcome.REGISTERED]
        tellings = [settle_call(live.keys, live.job.id, [ref], outcome.value, dead) for ref, outcome in ended]
        if tellings:
            await execute_async(redis, tellings)
        return web.json_response({"status": "waiting", "children": len(children)}, status=202)

    async def _continuations(self, request: web.Request, live: LiveAttempt) -> list[str]:
        """The job's children that wait for the job itself (`after` names it): waiting for them would wait forever.
        A child's `after` is written once, with it, so reading it before the wait is as good as during."""
        redis = self._client(request).redis
        parent = job_ref(live.job.queue, live.job.id)
        refs = [as_text(r) for r in await redis.zrange(live.keys.children(live.job.id), 0, -1)]
        found = []
        for ref in refs:
            queue, child_id = split_job_ref(ref)
            after = await redis.hget(QueueKeys.of(live.keys.namespace, queue).job(child_id), "after")
            if after is not None and parent in json.loads(after):  # references, as the enqueue script stored them
                found.append(ref)
        return found

    async def write_step(self, request: web.Request, live: LiveAttempt) -> web.Response:
        name = _step_name(request)
        settings = self._config(request).handler_api
        result = await request.read()
        if len(result) > settings.max_step_bytes:
            return _error(
                413, f"a step's result is at most {settings.max_step_bytes} bytes (handler_api.max_step_bytes)"
            )
        value = step_value(result, now_ms())
        call = step_call(live.keys, live.job.id, live.lease_token, name, value, settings.max_steps)
        await self._write(request, call)
        return web.json_response({"name": name, "size": len(result)}, status=201)

    async def _write(self, request: web.Request, call: Any) -> None:
        (reply,) = await execute_async(self._client(request).redis, [call])
        status = as_text(reply)
        if status != ACCEPTED:
            raise Refused(409, _refusal(status))


def _refusal(status: str) -> str:
    """A script's refusal in the words the attempt desk uses for the same."""
    return {"lease lost": LEASE_LOST, "canceled": "the job was canceled"}.get(status, status)


def _step_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not 0 < len(name) <= MAX_STEP_NAME or not name.isprintable():
        raise InvalidJob(f"a step's name is 1 to {MAX_STEP_NAME} printable characters")
    return name


async def _json_object(request: web.Request, *, empty_ok: bool = False) -> dict[str, Any]:
    data = await request.read()
    if not data and empty_ok:
        return {}
    try:
        document = loads_strict(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidJob(f"request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidJob("request body must be a JSON object")
    return document


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)
