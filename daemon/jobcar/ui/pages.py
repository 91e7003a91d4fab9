"""The dashboard's routes: each page read through `reads.py` and rendered by a template, and each action
(a POST, when `ui.write` is on) done through `Admin` or the schedule store, as the CLI does it. A job's page is
`job_page.py`'s, the bulk actions `bulk_actions.py`'s; what every page is made of, `page_parts.py`.

    GET  /ui/                       overview: queues, last hour, live daemons (`overview.json` for the updates)
    GET  /ui/queues/{queue}         a queue's jobs by state, paged and filtered
    GET  /ui/queues/{queue}/dead    its dead-letter queue, grouped by type and error, with bulk actions
    GET  /ui/job?queue=&id=         a job (`/ui/job/payload?...` its raw payload, as a download; `/ui/job.json?...`
                                    what its handler writes while it runs, for the page's updates)
    GET  /ui/schedules, /ui/limits  periodic jobs; flow control now
    POST /ui/job/{cancel|requeue|delete}, /ui/queues/{queue}/{pause|resume},
         /ui/queues/{queue}/dead/{confirm|apply}, /ui/queues/{queue}/cancel/{confirm|apply} (by filter),
         /ui/schedules/{name}/{pause|resume|trigger}
    GET|POST /ui/login, POST /ui/logout
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeAlias

from aiohttp import web
from redis import exceptions as redis_errors

from jobcar.admin import Admin
from jobcar.admin_reads import AmbiguousJob, JobNotFound
from jobcar.api_tokens import Role, Tokens, allows, caller, token_table
from jobcar.config_types import Config, limit_rule_table
from jobcar.errors import InvalidJob
from jobcar.formats import redact
from jobcar.job import State
from jobcar.schedule_store import change, every_schedule, trigger
from jobcar.transitions import CancelResult
from jobcar.transport import run_async
from jobcar.ui import bulk_actions, job_page, reads
from jobcar.ui.access import ACCESS, SESSION_SECONDS, Access, guard, login_cookie
from jobcar.ui.page_parts import (
    ADMIN,
    CONFIG,
    TEMPLATES,
    filter_query,
    job_ref,
    link,
    message,
    number,
    queue_name,
    read_filters,
    render,
    templates,
)

_HERE: Final = Path(__file__).parent
log = logging.getLogger("jobcar.ui")
#: Where signing in may lead: a dashboard path and query, printable ASCII without a backslash.
_NEXT: Final = re.compile(r"/ui(?:[/?][\x21-\x5b\x5d-\x7e]*)?")
Page: TypeAlias = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_ui_app(admin: Admin, config: Config, tokens: Tokens | None = None) -> web.Application:
    """The dashboard as an aiohttp app to mount at /ui (the daemon's listener) or serve alone (`jobcar ui`).
    `tokens`: the API's tokens in force, which a reload replaces; None: the config's, for good."""
    # guard outermost: its security headers go on the error pages too.
    app = web.Application(middlewares=[guard, _errors])
    app[ACCESS] = Access(tokens or Tokens(token_table(config)), config.ui.write, config.api_allowed_hosts)
    app[ADMIN] = admin
    app[CONFIG] = config
    app[TEMPLATES] = templates()
    get, post = app.router.add_get, app.router.add_post
    get("/", _overview)
    get("/overview.json", _overview_json)
    get("/queues/{queue}", _queue)
    get("/queues/{queue}/dead", _dead)
    get("/job", job_page.job)
    get("/job.json", job_page.job_json)
    get("/job/payload", job_page.payload)
    get("/schedules", _schedules)
    get("/limits", _limits)
    get("/login", _login_form)
    post("/login", _login)
    post("/logout", _logout)
    # Actions: refused by `access.guard` on a read-only dashboard.
    post("/job/{action:cancel|requeue|delete}", _job_action)
    post("/queues/{queue}/{action:pause|resume}", _pause)
    post("/queues/{queue}/dead/confirm", bulk_actions.dead_confirm)
    post("/queues/{queue}/dead/apply", bulk_actions.dead_apply)
    post("/queues/{queue}/cancel/{step:confirm|apply}", bulk_actions.cancel_matching)
    post("/schedules/{name}/{action:pause|resume|trigger}", _schedule_action)
    app.router.add_static("/static", _HERE / "static", append_version=False)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Page) -> web.StreamResponse:
    """Errors as pages, never a traceback; every text in them escaped by the template."""
    try:
        return await handler(request)
    except JobNotFound as exc:
        return message(request, "Not found", str(exc), "/ui/", 404)
    except AmbiguousJob as exc:
        return message(request, "Several jobs", str(exc), "/ui/", 409)
    except InvalidJob as exc:
        return message(request, "Bad request", str(exc), "/ui/", 400)
    except (redis_errors.RedisError, OSError) as exc:
        return message(request, "Redis unavailable", f"{type(exc).__name__}: {redact(str(exc))}", "/ui/", 503)
    except web.HTTPException:
        raise  # aiohttp's own answers (no such page, a redirect): `guard` adds the headers
    except Exception:
        log.exception("%s %s: unexpected error", request.method, request.path)
        return message(request, "Internal error", "something went wrong: see the log of the process serving this page",
                       "/ui/", 500)  # fmt: skip


async def _overview(request: web.Request) -> web.Response:
    overview = await reads.overview(request.app[ADMIN])
    return render(request, "overview.html", overview=overview, now_ms=overview.now_ms)


async def _overview_json(request: web.Request) -> web.Response:
    overview = await reads.overview(request.app[ADMIN])
    return web.json_response(overview.document())


async def _queue(request: web.Request) -> web.Response:
    admin, queue = request.app[ADMIN], queue_name(request)
    query = request.query
    try:
        wanted = State(query["state"]) if "state" in query else None
    except ValueError:
        raise InvalidJob("state must be one of the tabs") from None
    start = number(query, "start")
    if wanted is not None and wanted not in reads.LISTED:
        raise InvalidJob(f"no list of {wanted.value} jobs")
    newest_first = query.get("order") == "newest"
    filters = read_filters(query)
    skip = number(query, "skip")
    ((stats,), (history,)) = await asyncio.gather(admin.stats([queue]), admin.history([queue]))
    # Without a tab asked for, the first that holds jobs; with none, the jobs that finished lately.
    first = next((s for s in reads.LISTED if s is not State.DONE and stats.in_state(s)), State.DONE)
    state: State = first if wanted is None else wanted
    page = await reads.browse(admin, stats, state, start, filters, newest_first, skip)
    here = {"state": state.value, **filter_query(filters), "order": "newest" if newest_first else ""}
    return render(
        request, "queue.html", queue=queue, stats=stats, state=state, states=reads.LISTED, page=page, start=start,
        hour=reads.by_type(history), older=filter_query(filters)["older"], filter_fields=filter_query(filters),
        filters=filters, newest_first=newest_first, now_ms=stats.now_ms, page_size=reads.PAGE_SIZE,
        next_link=None if page.next_start is None else link(request.path, **here, start=page.next_start,
                                                            skip=page.next_skip or None),
        first_link=link(request.path, **here) if start else None,
        previous_link=link(request.path, **here, start=max(0, start - reads.PAGE_SIZE))
        if start and not filters.any and state is not State.DONE else None,
        tab_link=lambda s: link(request.path, state=s.value),
        type_link=lambda t: link(request.path, state=state.value, type=t),
    )  # fmt: skip


async def _dead(request: web.Request) -> web.Response:
    admin, queue = request.app[ADMIN], queue_name(request)
    query = request.query
    filters = reads.Filters(query.get("type", ""), query.get("error", ""))
    start = number(query, "start")
    (stats,) = await admin.stats([queue])
    # The groups and the page read independently: sent together.
    groups, page = await asyncio.gather(
        reads.dead_groups(admin, queue, stats.dead),
        reads.browse(admin, stats, State.DEAD, start, filters, newest_first=True),
    )
    here = {"type": filters.job_type, "error": filters.error}
    return render(
        request, "dead.html", queue=queue, stats=stats, groups=groups, page=page, filters=filters,
        now_ms=stats.now_ms, next_link=None if page.next_start is None else link(request.path, **here,
                                                                                  start=page.next_start),
        group_link=lambda **q: link(request.path, **q),
    )  # fmt: skip


async def _schedules(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    states = await run_async(admin.redis, every_schedule(admin.namespace))
    return render(request, "schedules.html", schedules=states, now_ms=await admin.now_ms())


async def _limits(request: web.Request) -> web.Response:
    groups = await request.app[ADMIN].limits(limit_rule_table(request.app[CONFIG]))
    return render(request, "limits.html", groups=groups)


async def _login_form(request: web.Request) -> web.Response:
    return render(request, "login.html", next=_safe_next(request.query.get("next")), failed=None)


async def _login(request: web.Request) -> web.StreamResponse:
    access = request.app[ACCESS]
    form = await request.post()
    target = _safe_next(form.get("next"))
    given = form.get("token")
    if not access.table.enabled:
        raise web.HTTPSeeOther(target)
    token = access.table.match(given) if isinstance(given, str) else None
    if token is None:
        return render(request, "login.html", 401, next=target, failed="That is not the API token.")
    if not allows(token.role, Role.READ):  # a produce token reads nothing
        why = f"Token {token.name} has role {token.role.value}: the dashboard needs a read or operate token."
        return render(request, "login.html", 403, next=target, failed=why)
    log.info("dashboard: %s (role %s) signed in", token.name, token.role.value)
    response = _see_other(target)
    login_cookie(response, request, access.new_session(token), SESSION_SECONDS)
    return response


async def _logout(request: web.Request) -> web.StreamResponse:
    response = _see_other("/ui/login")
    login_cookie(response, request, "", 0)  # expired at once
    return response


def _see_other(location: str) -> web.Response:
    """A redirect that may carry cookies (a raised HTTPSeeOther would drop them)."""
    return web.Response(status=303, headers={"Location": location})


def _safe_next(value: object) -> str:
    """Where to go after signing in: a dashboard path only (never another site)."""
    if isinstance(value, str) and _NEXT.fullmatch(value):
        return value
    return "/ui/"


async def _job_action(request: web.Request) -> web.Response:
    admin, action = request.app[ADMIN], request.match_info["action"]
    queue, job_id = job_ref(await request.post())
    back = link("/ui/job", queue=queue, id=job_id)
    if action == "cancel":
        reply = await admin.cancel(job_id, queue)
        log.info("dashboard: cancel of job %s in %s by %s: %s", job_id, queue, caller(request), reply.result.value)
        if reply.result is CancelResult.MISSING or reply.before is None:
            return message(request, "Nothing done", f"job {job_id} no longer exists", f"/ui/queues/{queue}", 404)
        if reply.result is CancelResult.NOT_CANCELABLE:
            return message(request, "Nothing done", f"job {job_id} had already finished ({reply.before.value})", back)
        if reply.result is CancelResult.CANCELED:
            text = f"job {job_id} was {reply.before.value}: it is canceled and gone"
            return message(request, "Canceled", text, f"/ui/queues/{queue}")
        text = f"job {job_id} is running: its daemon stops its handler, and the job ends canceled"
        return message(request, "Cancel requested", text, back)
    bulk = admin.requeue_dead if action == "requeue" else admin.purge_dead
    moved, problems = await bulk([queue], [job_id])
    log.info("dashboard: %s of dead job %s in %s by %s: %s", "requeue" if action == "requeue" else "purge", job_id,
             queue, caller(request), "done" if moved.get(queue) else "nothing done")  # fmt: skip
    if not moved.get(queue):
        return message(request, "Nothing done", "; ".join(problems) or f"job {job_id} is not dead", back, 409)
    if action == "requeue":
        return message(request, "Requeued", f"job {job_id} is pending again", back)
    return message(request, "Deleted", f"dead job {job_id} is deleted for good", f"/ui/queues/{queue}/dead")


async def _pause(request: web.Request) -> web.Response:
    queue, paused = queue_name(request), request.match_info["action"] == "pause"
    changed = await request.app[ADMIN].set_paused(queue, paused)
    word = "paused" if paused else "resumed"
    log.info("dashboard: queue %s %s by %s%s", queue, word, caller(request), "" if changed else " (it already was)")
    text = f"queue {queue} is {word}" if changed else f"queue {queue} was already {word}: nothing changed"
    return message(request, word.capitalize(), text, f"/ui/queues/{queue}")


async def _schedule_action(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    name, action = request.match_info["name"], request.match_info["action"]
    log.info("dashboard: %s of schedule %s by %s", action, name, caller(request))
    if action == "trigger":
        job_id = await run_async(admin.redis, trigger(admin.namespace, name, request.app[CONFIG].max_payload_bytes))
        if job_id is None:
            return message(request, "Nothing done", f"no schedule {name}", "/ui/schedules", 404)
        return message(request, "Triggered", f"schedule {name} enqueued job {job_id}", "/ui/schedules")
    result = await run_async(admin.redis, change(admin.namespace, name, action))
    if result < 0:
        return message(request, "Nothing done", f"no schedule {name}", "/ui/schedules", 404)
    word = "paused" if action == "pause" else "resumed"
    text = f"schedule {name} is {word}" if result else f"schedule {name} was already {word}: nothing changed"
    return message(request, word.capitalize(), text, "/ui/schedules")
