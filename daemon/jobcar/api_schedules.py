"""The HTTP API's schedule routes, behind the same guard and token as the rest of the listener (api.py):

GET    /v1/schedules                  200 {"schedules": [document...]}
GET    /v1/schedules/{name}           200 the document (ScheduleState.document) | 404
PUT    /v1/schedules/{name}           a spec {"type", "cron" | "every", ...}: 200 {"name", "result"} | 400
                                      (result: created, changed or unchanged) | 415 not JSON
DELETE /v1/schedules/{name}           200 {"name", "changed": true} | 404
POST   /v1/schedules/{name}/pause     200 {"name", "changed"} (false: it already was) | 404
POST   /v1/schedules/{name}/resume    200 {"name", "changed"} | 404
POST   /v1/schedules/{name}/trigger   200 {"name", "job_id"}: one job now, the schedule's ticks unmoved | 404
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from jobcar.api_tokens import caller
from jobcar.client import AsyncClient
from jobcar.errors import InvalidJob
from jobcar.formats import loads_strict
from jobcar.names import check_name
from jobcar.schedules import SPEC_FIELDS

ClientOf = Callable[[web.Request], AsyncClient]
log = logging.getLogger("jobcar.api")


def add_schedule_routes(
    app: web.Application, client_of: ClientOf, not_json: Callable[[web.Request], str | None]
) -> None:
    """`client_of` gives the daemon's AsyncClient; `not_json` says why a body is not declared JSON."""

    def name_of(request: web.Request) -> str:
        return check_name("schedule name", request.match_info["name"])

    async def list_all(request: web.Request) -> web.Response:
        states = await client_of(request).schedules()
        return web.json_response({"schedules": [s.document() for s in states]})

    async def show(request: web.Request) -> web.Response:
        state = await client_of(request).schedule(name_of(request))
        if state is None:
            return _missing()
        return web.json_response(state.document())

    async def put(request: web.Request) -> web.Response:
        why = not_json(request)
        if why is not None:
            return web.json_response({"error": why}, status=415)
        name = name_of(request)
        try:
            document = loads_strict(await request.read())
        except (ValueError, RecursionError) as exc:
            raise InvalidJob(f"request body is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise InvalidJob("request body must be a JSON object: the schedule")
        unknown = sorted(document.keys() - set(SPEC_FIELDS))
        if unknown:
            raise InvalidJob(f"unknown field(s): {', '.join(unknown)}")
        if not isinstance(document.get("type"), str):
            raise InvalidJob("type is required: the job type each tick enqueues")
        result = await client_of(request).upsert_schedule(name, **document)
        log.info("schedule %s set by %s: %s", name, caller(request), result)
        return web.json_response({"name": name, "result": result})

    def change(action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def run(request: web.Request) -> web.Response:
            name = name_of(request)
            result = await client_of(request).change_schedule(name, action)
            log.info("schedule %s: %s by %s%s", name, action, caller(request), {-1: " (no such schedule)",
                     0: " (nothing changed)"}.get(result, ""))  # fmt: skip
            if result < 0:
                return _missing()
            return web.json_response({"name": name, "changed": result == 1})

        return run

    async def trigger(request: web.Request) -> web.Response:
        name = name_of(request)
        job_id = await client_of(request).trigger_schedule(name)
        log.info("schedule %s: trigger by %s: %s", name, caller(request), job_id or "no such schedule")
        if job_id is None:
            return _missing()
        return web.json_response({"name": name, "job_id": job_id})

    app.router.add_get("/v1/schedules", list_all)
    app.router.add_get("/v1/schedules/{name}", show)
    app.router.add_put("/v1/schedules/{name}", put)
    app.router.add_delete("/v1/schedules/{name}", change("remove"))
    app.router.add_post("/v1/schedules/{name}/pause", change("pause"))
    app.router.add_post("/v1/schedules/{name}/resume", change("resume"))
    app.router.add_post("/v1/schedules/{name}/trigger", trigger)


def _missing() -> web.Response:
    return web.json_response({"error": "no such schedule"}, status=404)
