"""The HTTP API's listing and bulk cancel of jobs, behind the same guard and token as the rest of the listener (api.py):

GET /v1/jobs?state=S[&queue=Q&limit=N&cursor=C&scan=B][&type=T&key=K&id_prefix=P&older_than=1h&where=COND...]
    200 {"queue", "state", "total", "examined", "cursor", "jobs": [document...]}: up to `limit` jobs (default 50,
    at most 1000) of one state of one queue (default `default`), in the order they leave it, each the job
    document of GET /v1/jobs/{id} (a held job's `held_for` names the limit group holding it, `held_since`
    since when). A filter keeps the jobs of a type, a limit key, an id prefix, enqueued at least `older_than`
    ago, and (`where`, repeated: all must hold) whose payload field or meta value is a text:
    `payload.customer=42`, `payload.address.city=Lyon`, `meta.tenant=acme` (job_search.Condition). With a
    filter a walk looks at no more than `scan` jobs (default 5000); `examined` says how many it looked at, and
    `cursor` (null at the state's end) is where the next walk starts (job_search.py). `state=done`: the jobs
    whose result `result_ttl` keeps, in no set, found by SCAN in no order (`total` null; a filter looks at no
    more than `scan` of the queue's job keys). | 400 a bad parameter

POST /v1/jobs/cancel  {"queue"?, "states"?, "type"?, "key"?, "id_prefix"?, "older_than"?, "where"?: [COND...],
                       "all"?: true, "dry_run"?: true}
    200 {"dry_run", "examined", "matched", "canceled", "left", "by_queue": [{"queue", "state", "examined",
    "matched", "canceled", "left"}...]}: cancels the pending, held, scheduled and waiting jobs (or those of
    `states`) of `queue` (default: every queue) that the filter matches, in bounded steps
    (Admin.cancel_queue_state); a job that started running meanwhile is not canceled (`left` counts those).
    A filter, or "all": true, is required. `dry_run` counts and changes nothing. | 400 | 415 not JSON
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from aiohttp import web
from multidict import MultiMapping

from jobcar.admin import CANCELABLE, Admin
from jobcar.api_tokens import caller
from jobcar.errors import InvalidJob
from jobcar.formats import loads_strict
from jobcar.job import State
from jobcar.job_document import job_document
from jobcar.job_search import MAX_SCAN_BUDGET, SCAN_BUDGET, WALKABLE, JobFilter, find, find_done, parse_condition
from jobcar.keys import DEFAULT_QUEUE
from jobcar.names import check_name
from jobcar.units import parse_duration

AdminOf = Callable[[web.Request], Admin]

#: Jobs per GET /v1/jobs page, by default and at most.
DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 1000
#: The filter's parameters, of GET /v1/jobs and of POST /v1/jobs/cancel's body.
FILTER_FIELDS: Final = ("type", "key", "id_prefix", "older_than", "where")
_LIST_PARAMETERS: Final = frozenset({"queue", "state", "limit", "cursor", "scan", *FILTER_FIELDS})
_CANCEL_FIELDS: Final = frozenset({"queue", "states", "all", "dry_run", *FILTER_FIELDS})
log = logging.getLogger("jobcar.api")


def add_job_routes(app: web.Application, admin_of: AdminOf, not_json: Callable[[web.Request], str | None]) -> None:
    """`admin_of` gives the listener's Admin; `not_json` says why a body is not declared JSON."""

    async def list_jobs(request: web.Request) -> web.Response:
        query = request.query
        unknown = sorted(set(query) - _LIST_PARAMETERS)
        if unknown:
            raise InvalidJob(f"unknown parameter(s): {', '.join(unknown)}")
        queue = check_name("queue name", query.get("queue") or DEFAULT_QUEUE)
        state = _state(query.get("state"))
        job_filter = filter_of(query)
        limit = _number(query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        budget = _number(query, "scan", SCAN_BUDGET, 1, MAX_SCAN_BUDGET)
        start, skip = _cursor(query.get("cursor"))
        admin = admin_of(request)
        if state is State.DONE:
            found = await find_done(admin, queue, job_filter, start, skip, limit, budget, await admin.now_ms())
        elif skip:
            raise InvalidJob("cursor must be one a page of this state gave")
        else:
            found = await find(admin, queue, state, job_filter, start, limit, budget)
        cursor = None if found.next_start is None else str(found.next_start)
        if cursor is not None and found.next_skip:
            cursor += f".{found.next_skip}"
        document: dict[str, Any] = {
            "queue": queue, "state": state.value, "total": found.total, "examined": found.examined,
            "cursor": cursor, "jobs": [job_document(job) for job in found.jobs],
        }  # fmt: skip
        if found.unreadable:
            document["unreadable"] = found.unreadable
        return web.json_response(document)

    async def cancel(request: web.Request) -> web.Response:
        why = not_json(request)
        if why is not None:
            return web.json_response({"error": why}, status=415)
        try:
            body = loads_strict(await request.read())
        except (ValueError, RecursionError) as exc:
            raise InvalidJob(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidJob("request body must be a JSON object: the filter")
        unknown = sorted(set(body) - _CANCEL_FIELDS)
        if unknown:
            raise InvalidJob(f"unknown field(s): {', '.join(unknown)}")
        where = body.get("where", [])
        if not isinstance(where, list):
            raise InvalidJob("where must be a list of conditions, each payload.FIELD=VALUE or meta.NAME=VALUE")
        job_filter = filter_of(body, where)
        every, dry_run = body.get("all", False), body.get("dry_run", False)
        if not isinstance(every, bool) or not isinstance(dry_run, bool):
            raise InvalidJob("all and dry_run are true or false")
        if not job_filter.any and not every:
            raise InvalidJob('give a filter (type, key, id_prefix, older_than, where), or "all": true')
        queue = body.get("queue")
        if queue is not None and not isinstance(queue, str):
            raise InvalidJob("queue must be a queue name")
        states = _cancel_states(body.get("states"))
        admin = admin_of(request)
        tallies = await admin.cancel_matching(await admin.queues(queue and check_name("queue name", queue)), states,
                                              job_filter, dry_run)  # fmt: skip
        canceled = sum(t.canceled for t in tallies)
        if not dry_run:
            log.info("POST /v1/jobs/cancel by %s: %d job(s) canceled (%s)", caller(request), canceled,
                     job_filter.describe())  # fmt: skip
        return web.json_response({
            "dry_run": dry_run, "examined": sum(t.examined for t in tallies),
            "matched": sum(t.matched for t in tallies), "canceled": canceled, "left": sum(t.left for t in tallies),
            "by_queue": [t.document() for t in tallies if t.examined],
        })  # fmt: skip

    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_post("/v1/jobs/cancel", cancel)


def _cancel_states(value: object) -> list[State]:
    names = ", ".join(s.value for s in CANCELABLE)
    if value is None:
        return list(CANCELABLE)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidJob(f"states must be a list of states: {names}")
    states = []
    for name in dict.fromkeys(value):
        if name not in {s.value for s in CANCELABLE}:
            raise InvalidJob(f"a bulk cancel takes {names} jobs, not {name}")
        states.append(State(name))
    return states


def filter_of(values: Mapping[str, object], conditions: Sequence[object] | None = None) -> JobFilter:
    """The filter of a query (`where` repeated) or of a JSON body (`where` a list); each part a string."""
    texts = {}
    for name in ("type", "key", "id_prefix", "older_than"):
        value = values.get(name, "")
        if not isinstance(value, str):
            raise InvalidJob(f"{name} must be a string")
        texts[name] = value
    if conditions is None:
        conditions = values.getall("where", []) if isinstance(values, MultiMapping) else []
    if not all(isinstance(c, str) for c in conditions):
        raise InvalidJob("where must be a list of conditions, each payload.FIELD=VALUE or meta.NAME=VALUE")
    older_than_ms = 0
    if texts["older_than"]:
        try:
            older_than_ms = int(parse_duration(texts["older_than"]) * 1000)
        except (ValueError, OverflowError) as exc:
            raise InvalidJob(f"older_than: {exc}") from None
    return JobFilter(
        job_type=texts["type"], id_prefix=texts["id_prefix"], key=texts["key"], older_than_ms=older_than_ms,
        where=tuple(parse_condition(str(c)) for c in conditions),
    )  # fmt: skip


def _cursor(text: str | None) -> tuple[int, int]:
    """(position, 0), or for done jobs (SCAN cursor, keys of its step already taken): "N" or "N.S"."""
    if text is None:
        return 0, 0
    start, dot, skip = text.partition(".")
    parts = [start, skip] if dot else [start]
    if not all(p.isascii() and p.isdigit() and len(p) <= 19 and int(p) < 2**63 for p in parts):
        raise InvalidJob("cursor must be one a page of this state gave")
    return int(start), int(skip) if dot else 0


def _state(text: str | None) -> State:
    names = ", ".join(s.value for s in (*WALKABLE, State.DONE))
    if text is None:
        raise InvalidJob(f"state is required: one of {names}")
    try:
        state = State(text)
    except ValueError:
        state = None
    if state not in WALKABLE and state is not State.DONE:
        raise InvalidJob(f"state must be one of {names}")
    assert state is not None
    return state


def _number(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not low <= int(text) <= high:
        raise InvalidJob(f"{name} must be a whole number from {low} to {high}")
    return int(text)
