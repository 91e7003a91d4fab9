"""The dashboard's routes: each page read through `reads.py` and rendered by a template, and each action
(a POST, when `ui.write` is on) done through `Admin` or the schedule store, as the CLI does it.

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
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from redis import exceptions as redis_errors

from jobcar.admin import CANCELABLE, Admin
from jobcar.admin_reads import AmbiguousJob, JobNotFound
from jobcar.api_tokens import Role, Tokens, allows, caller, token_table
from jobcar.cli_format import byte_size, percent_text, span
from jobcar.config_types import Config, limit_rule_table
from jobcar.errors import InvalidJob
from jobcar.formats import redact
from jobcar.job import FINISHED, State
from jobcar.job_search import parse_condition
from jobcar.job_view import JobView, LogRead
from jobcar.keys import DEFAULT_NAMESPACE
from jobcar.names import ID_PATTERN, check_name
from jobcar.schedule_store import change, every_schedule, trigger
from jobcar.timestamps import rfc3339_ms
from jobcar.tracing import trace_link
from jobcar.transitions import CancelResult
from jobcar.transport import run_async
from jobcar.ui import reads
from jobcar.ui.access import ACCESS, CSRF_FIELD, SESSION_COOKIE, SESSION_SECONDS, Access, guard, login_cookie
from jobcar.units import parse_duration

#: The payload shown on a job's page, pretty-printed; the download has all of it.
PAYLOAD_SHOWN_BYTES: Final = 64 * 1024
#: The newest lines of a job's log its page shows (`jobcar jobs logs` prints them all).
LOG_SHOWN_LINES: Final = 200
_HERE: Final = Path(__file__).parent
log = logging.getLogger("jobcar.ui")
#: Where signing in may lead: a dashboard path and query, printable ASCII without a backslash.
_NEXT: Final = re.compile(r"/ui(?:[/?][\x21-\x5b\x5d-\x7e]*)?")
ADMIN: Final = web.AppKey("jobcar.ui.admin", Admin)
CONFIG: Final = web.AppKey("jobcar.ui.config", Config)
TEMPLATES: Final = web.AppKey("jobcar.ui.templates", jinja2.Environment)
Page: TypeAlias = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_ui_app(admin: Admin, config: Config, tokens: Tokens | None = None) -> web.Application:
    """The dashboard as an aiohttp app to mount at /ui (the daemon's listener) or serve alone (`jobcar ui`).
    `tokens`: the API's tokens in force, which a reload replaces; None: the config's, for good."""
    # guard outermost: its security headers go on the error pages too.
    app = web.Application(middlewares=[guard, _errors])
    app[ACCESS] = Access(tokens or Tokens(token_table(config)), config.ui.write, config.api_allowed_hosts)
    app[ADMIN] = admin
    app[CONFIG] = config
    app[TEMPLATES] = _templates()
    get, post = app.router.add_get, app.router.add_post
    get("/", _overview)
    get("/overview.json", _overview_json)
    get("/queues/{queue}", _queue)
    get("/queues/{queue}/dead", _dead)
    get("/job", _job)
    get("/job.json", _job_json)
    get("/job/payload", _payload)
    get("/schedules", _schedules)
    get("/limits", _limits)
    get("/login", _login_form)
    post("/login", _login)
    post("/logout", _logout)
    # Actions: refused by `access.guard` on a read-only dashboard.
    post("/job/{action:cancel|requeue|delete}", _job_action)
    post("/queues/{queue}/{action:pause|resume}", _pause)
    post("/queues/{queue}/dead/confirm", _dead_confirm)
    post("/queues/{queue}/dead/apply", _dead_apply)
    post("/queues/{queue}/cancel/{step:confirm|apply}", _cancel_matching)
    post("/schedules/{name}/{action:pause|resume|trigger}", _schedule_action)
    app.router.add_static("/static", _HERE / "static", append_version=False)
    return app


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise (none does)
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["time"] = lambda ms: rfc3339_ms(ms) or "—"
    env.filters["ago"] = _ago
    env.filters["seconds"] = span
    env.filters["bytes"] = byte_size
    env.filters["percent"] = percent_text
    return env


def _ago(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "—"
    delta = (now_ms - ms) / 1000
    return f"{span(delta)} ago" if delta >= 0 else f"in {span(-delta)}"


def render(request: web.Request, template: str, status: int = 200, **values: Any) -> web.Response:
    access = request.app[ACCESS]
    page = request.app[TEMPLATES].get_template(template).render(
        csrf_field=CSRF_FIELD, csrf=access.csrf_token(request), write=access.may_act(request),
        signed_in=access.session_token(request.cookies.get(SESSION_COOKIE)) is not None,
        namespace=request.app[CONFIG].namespace, default_namespace=DEFAULT_NAMESPACE, path=request.path, **values,
    )  # fmt: skip
    return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")


def _message(request: web.Request, title: str, text: str, back: str, status: int = 200) -> web.Response:
    """What an action did (or why it did nothing), with the way back."""
    return render(request, "message.html", status, title=title, text=text, back=back)


@web.middleware
async def _errors(request: web.Request, handler: Page) -> web.StreamResponse:
    """Errors as pages, never a traceback; every text in them escaped by the template."""
    try:
        return await handler(request)
    except JobNotFound as exc:
        return _message(request, "Not found", str(exc), "/ui/", 404)
    except AmbiguousJob as exc:
        return _message(request, "Several jobs", str(exc), "/ui/", 409)
    except InvalidJob as exc:
        return _message(request, "Bad request", str(exc), "/ui/", 400)
    except (redis_errors.RedisError, OSError) as exc:
        return _message(request, "Redis unavailable", f"{type(exc).__name__}: {redact(str(exc))}", "/ui/", 503)
    except web.HTTPException:
        raise  # aiohttp's own answers (no such page, a redirect): `guard` adds the headers
    except Exception:
        log.exception("%s %s: unexpected error", request.method, request.path)
        return _message(request, "Internal error", "something went wrong: see the log of the process serving this page",
                        "/ui/", 500)  # fmt: skip


def _queue_name(request: web.Request) -> str:
    return check_name("queue name", request.match_info["queue"])


def _job_ref(values: Mapping[str, Any]) -> tuple[str, str]:
    queue, job_id = check_name("queue name", values.get("queue")), values.get("id")
    if not isinstance(job_id, str) or not ID_PATTERN.fullmatch(job_id):
        raise InvalidJob("a job id is needed")
    return queue, job_id


def _number(query: Mapping[str, str], name: str) -> int:
    """A paging value of a Next link (`start`: a position in a state's order, or a SCAN cursor), below 2**63."""
    text = query.get(name, "0")
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
        raise InvalidJob(f"{name} must be a number from a Next link")
    return int(text)


def _link(path: str, **query: object) -> str:
    kept = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


async def _overview(request: web.Request) -> web.Response:
    overview = await reads.overview(request.app[ADMIN])
    return render(request, "overview.html", overview=overview, now_ms=overview.now_ms)


async def _overview_json(request: web.Request) -> web.Response:
    overview = await reads.overview(request.app[ADMIN])
    return web.json_response(overview.document())


async def _queue(request: web.Request) -> web.Response:
    admin, queue = request.app[ADMIN], _queue_name(request)
    query = request.query
    try:
        wanted = State(query["state"]) if "state" in query else None
    except ValueError:
        raise InvalidJob("state must be one of the tabs") from None
    start = _number(query, "start")
    if wanted is not None and wanted not in reads.LISTED:
        raise InvalidJob(f"no list of {wanted.value} jobs")
    newest_first = query.get("order") == "newest"
    filters = _filters(query)
    skip = _number(query, "skip")
    ((stats,), (history,)) = await asyncio.gather(admin.stats([queue]), admin.history([queue]))
    # Without a tab asked for, the first that holds jobs; with none, the jobs that finished lately.
    first = next((s for s in reads.LISTED if s is not State.DONE and stats.in_state(s)), State.DONE)
    state: State = first if wanted is None else wanted
    page = await reads.browse(admin, stats, state, start, filters, newest_first, skip)
    here = {"state": state.value, **_filter_query(filters), "order": "newest" if newest_first else ""}
    return render(
        request, "queue.html", queue=queue, stats=stats, state=state, states=reads.LISTED, page=page, start=start,
        hour=reads.by_type(history), older=_filter_query(filters)["older"], filter_fields=_filter_query(filters),
        filters=filters, newest_first=newest_first, now_ms=stats.now_ms, page_size=reads.PAGE_SIZE,
        next_link=None if page.next_start is None else _link(request.path, **here, start=page.next_start,
                                                             skip=page.next_skip or None),
        first_link=_link(request.path, **here) if start else None,
        previous_link=_link(request.path, **here, start=max(0, start - reads.PAGE_SIZE))
        if start and not filters.any and state is not State.DONE else None,
        tab_link=lambda s: _link(request.path, state=s.value),
        type_link=lambda t: _link(request.path, state=state.value, type=t),
    )  # fmt: skip


def _filters(values: Mapping[str, Any]) -> reads.Filters:
    """A queue page's filters from its query (or a bulk form): type, error text, id prefix, key, age (`older`,
    a duration) and one search condition (`where`: payload.FIELD=VALUE or meta.NAME=VALUE)."""
    text = {name: str(values.get(name, "")).strip() for name in ("type", "error", "id", "key", "older", "where")}
    try:
        older_than_ms = int(parse_duration(text["older"]) * 1000) if text["older"] else 0
    except (ValueError, OverflowError) as exc:
        raise InvalidJob(f"older than: {exc}") from None
    where = (parse_condition(text["where"]),) if text["where"] else ()
    return reads.Filters(text["type"], text["error"], text["id"], text["key"], older_than_ms, where)


def _filter_query(filters: reads.Filters) -> dict[str, str]:
    """The query that gives back these filters (`_filters`)."""
    return {"type": filters.job_type, "error": filters.error, "id": filters.id_prefix, "key": filters.key,
            "older": f"{filters.older_than_ms / 1000:g}s" if filters.older_than_ms else "",
            "where": str(filters.where[0]) if filters.where else ""}  # fmt: skip


async def _dead(request: web.Request) -> web.Response:
    admin, queue = request.app[ADMIN], _queue_name(request)
    query = request.query
    filters = reads.Filters(query.get("type", ""), query.get("error", ""))
    start = _number(query, "start")
    (stats,) = await admin.stats([queue])
    # The groups and the page read independently: sent together.
    groups, page = await asyncio.gather(
        reads.dead_groups(admin, queue, stats.dead),
        reads.browse(admin, stats, State.DEAD, start, filters, newest_first=True),
    )
    here = {"type": filters.job_type, "error": filters.error}
    return render(
        request, "dead.html", queue=queue, stats=stats, groups=groups, page=page, filters=filters,
        now_ms=stats.now_ms, next_link=None if page.next_start is None else _link(request.path, **here,
                                                                                   start=page.next_start),
        group_link=lambda **q: _link(request.path, **q),
    )  # fmt: skip


async def _job(request: web.Request) -> web.Response:
    queue, job_id = _job_ref(request.query)
    admin = request.app[ADMIN]
    view = await admin.job(job_id, queue)
    log = await _log_tail(admin, view)
    document = view.document()
    if "payload" in document:
        shown = json.dumps(document["payload"], indent=2, ensure_ascii=False)
    else:
        shown = f"({len(view.job.payload)} bytes of {view.job.content_type}: download it below)"
    cut = len(shown.encode()) > PAYLOAD_SHOWN_BYTES
    if cut:
        shown = shown.encode()[:PAYLOAD_SHOWN_BYTES].decode("utf-8", "ignore")
    return render(
        request, "job.html", job=view.job, view=view, document=document, payload=shown, payload_cut=cut,
        now_ms=view.now_ms, finished=view.job.state in FINISHED, log=log, log_shown=LOG_SHOWN_LINES,
        payload_link=_link("/ui/job/payload", queue=queue, id=job_id), job_link=_job_link,
        live_link=_link("/ui/job.json", queue=queue, id=job_id),
        trace_link=trace_link(request.app[CONFIG].tracing.trace_url, view.job.traceparent),
    )  # fmt: skip


async def _log_tail(admin: Admin, view: JobView) -> LogRead | None:
    """The newest LOG_SHOWN_LINES lines of the job's log, when it has one."""
    if not view.log_lines:
        return None
    return await admin.log_since(view.job.id, view.job.queue, last=LOG_SHOWN_LINES)


async def _job_json(request: web.Request) -> web.Response:
    """What changes on a job's page while it runs, for its script: state, progress, the log's newest lines,
    steps, children. Text is the handler's own: the script writes it as text, never as HTML."""
    queue, job_id = _job_ref(request.query)
    admin = request.app[ADMIN]
    view = await admin.job(job_id, queue)
    log = await _log_tail(admin, view)
    document = view.document()
    progress, reported = document["progress"], view.job.progress
    if progress is not None and reported is not None:
        progress["percent_text"] = None if reported.percent is None else percent_text(reported.percent)
    return web.json_response({
        "state": view.job.state.value, "finished": view.job.state in FINISHED, "attempt": view.job.attempt,
        "progress": progress,
        "log": {**document["log"], "shown": LOG_SHOWN_LINES, "lines_read": [] if log is None else [
            {"at": rfc3339_ms(e.at_ms), "attempt": e.attempt, "line": e.line} for e in log.entries]},
        "steps": [{**step, "size": byte_size(step["bytes"])} for step in document["steps"]],
        "children": [{**child, "link": _job_link(child["ref"], queue)} for child in document["children"]],
        "children_total": document["children_total"],
    }, headers={"Cache-Control": "no-store"})  # fmt: skip


def _job_link(ref: str, queue: str) -> str:
    """A link to a job named `<queue>/<id>` (or `<id>` in `queue`)."""
    other, slash, job_id = ref.partition("/")
    return _link("/ui/job", queue=other, id=job_id) if slash else _link("/ui/job", queue=queue, id=ref)


async def _payload(request: web.Request) -> web.Response:
    queue, job_id = _job_ref(request.query)
    view = await request.app[ADMIN].job(job_id, queue)
    # Always a download of opaque bytes: a payload is never rendered by the browser as a page of this origin.
    return web.Response(
        body=view.job.payload,
        content_type="application/octet-stream",
        headers={"Content-Disposition": 'attachment; filename="payload.bin"'},
    )


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
    queue, job_id = _job_ref(await request.post())
    back = _link("/ui/job", queue=queue, id=job_id)
    if action == "cancel":
        reply = await admin.cancel(job_id, queue)
        log.info("dashboard: cancel of job %s in %s by %s: %s", job_id, queue, caller(request), reply.result.value)
        if reply.result is CancelResult.MISSING or reply.before is None:
            return _message(request, "Nothing done", f"job {job_id} no longer exists", f"/ui/queues/{queue}", 404)
        if reply.result is CancelResult.NOT_CANCELABLE:
            return _message(request, "Nothing done", f"job {job_id} had already finished ({reply.before.value})", back)
        if reply.result is CancelResult.CANCELED:
            text = f"job {job_id} was {reply.before.value}: it is canceled and gone"
            return _message(request, "Canceled", text, f"/ui/queues/{queue}")
        text = f"job {job_id} is running: its daemon stops its handler, and the job ends canceled"
        return _message(request, "Cancel requested", text, back)
    bulk = admin.requeue_dead if action == "requeue" else admin.purge_dead
    moved, problems = await bulk([queue], [job_id])
    log.info("dashboard: %s of dead job %s in %s by %s: %s", "requeue" if action == "requeue" else "purge", job_id,
             queue, caller(request), "done" if moved.get(queue) else "nothing done")  # fmt: skip
    if not moved.get(queue):
        return _message(request, "Nothing done", "; ".join(problems) or f"job {job_id} is not dead", back, 409)
    if action == "requeue":
        return _message(request, "Requeued", f"job {job_id} is pending again", back)
    return _message(request, "Deleted", f"dead job {job_id} is deleted for good", f"/ui/queues/{queue}/dead")


async def _pause(request: web.Request) -> web.Response:
    queue, paused = _queue_name(request), request.match_info["action"] == "pause"
    changed = await request.app[ADMIN].set_paused(queue, paused)
    word = "paused" if paused else "resumed"
    log.info("dashboard: queue %s %s by %s%s", queue, word, caller(request), "" if changed else " (it already was)")
    text = f"queue {queue} is {word}" if changed else f"queue {queue} was already {word}: nothing changed"
    return _message(request, word.capitalize(), text, f"/ui/queues/{queue}")


@dataclass(frozen=True)
class _Bulk:
    """A bulk action of the dead-letter page, as its form asks for it."""

    queue: str
    action: str  # requeue or delete
    #: The ids selected; None: every dead job the filter matches (with no filter, every dead job of the queue).
    ids: list[str] | None
    filters: reads.Filters

    @property
    def everything(self) -> bool:
        return self.ids is None and not self.filters.any


async def _bulk(request: web.Request) -> _Bulk:
    form = await request.post()
    action = form.get("action")
    if action not in ("requeue", "delete"):
        raise InvalidJob("action must be requeue or delete")
    filters = reads.Filters(str(form.get("type", "")), str(form.get("error", "")))
    if form.get("scope") == "filter":
        return _Bulk(_queue_name(request), action, None, filters)
    ids = [i for i in form.getall("id", []) if isinstance(i, str) and ID_PATTERN.fullmatch(i)]
    return _Bulk(_queue_name(request), action, ids, filters)


async def _dead_confirm(request: web.Request) -> web.Response:
    admin, bulk = request.app[ADMIN], await _bulk(request)
    if bulk.everything:
        (stats,) = await admin.stats([bulk.queue])
        count = stats.dead
    elif bulk.ids is None:
        count = len(await reads.dead_matching(admin, bulk.queue, bulk.filters))
    else:
        count = len(bulk.ids)
    if not count:
        text = "no dead job was selected or matches"
        return _message(request, "Nothing selected", text, f"/ui/queues/{bulk.queue}/dead")
    return render(request, "confirm.html", bulk=bulk, count=count, group_limit=reads.GROUP_LIMIT)


async def _dead_apply(request: web.Request) -> web.Response:
    admin, bulk = request.app[ADMIN], await _bulk(request)
    problems: list[str] = []
    if bulk.everything:  # in bounded steps, like `jobcar dead requeue --all`
        drain = admin.requeue_all_dead if bulk.action == "requeue" else admin.purge_all_dead
        done = await drain(bulk.queue)
    else:
        # By filter: what matches now (the count confirmed may have changed since).
        ids = bulk.ids if bulk.ids is not None else await reads.dead_matching(admin, bulk.queue, bulk.filters)
        act = admin.requeue_dead if bulk.action == "requeue" else admin.purge_dead
        moved, problems = await act([bulk.queue], ids)
        done = moved.get(bulk.queue, 0)
    verb = "requeued" if bulk.action == "requeue" else "deleted"
    log.info("dashboard: %d dead jobs of %s %s by %s", done, bulk.queue, verb, caller(request))
    text = f"{done} dead job{'s' if done != 1 else ''} {verb}"
    if problems:
        text += f"; {len(problems)} not: " + "; ".join(problems[:5]) + (" …" if len(problems) > 5 else "")
    return _message(request, verb.capitalize(), text, f"/ui/queues/{bulk.queue}/dead")


async def _cancel_matching(request: web.Request) -> web.Response:
    """A queue page's bulk cancel: the jobs of one state (pending, held, scheduled, waiting) its filters match.
    `confirm` counts them (a dry run) and asks; `apply` cancels what matches then, in bounded steps
    (Admin.cancel_queue_state): a job that started running meanwhile is left to run."""
    admin, queue = request.app[ADMIN], _queue_name(request)
    form = await request.post()
    try:
        state = State(str(form.get("state", "")))
    except ValueError:
        state = State.DONE
    if state not in CANCELABLE:
        raise InvalidJob("a bulk cancel takes the pending, held, scheduled or waiting jobs")
    filters = _filters(form)
    back = _link(f"/ui/queues/{queue}", state=state.value, **_filter_query(filters))
    if request.match_info["step"] == "confirm":
        (tally,) = await admin.cancel_matching([queue], [state], filters, dry_run=True)
        if not tally.matched:
            return _message(request, "Nothing matches", f"no {state.value} job of {queue} matches", back)
        return render(request, "confirm_cancel.html", queue=queue, state=state, filters=filters, count=tally.matched,
                      what=filters.describe(), fields=_filter_query(filters), back=back)  # fmt: skip
    (tally,) = await admin.cancel_matching([queue], [state], filters)
    log.info("dashboard: %d %s job(s) of %s canceled by %s (%s)", tally.canceled, state.value, queue, caller(request),
             filters.describe())  # fmt: skip
    text = f"{tally.canceled} {state.value} job{'s' if tally.canceled != 1 else ''} canceled"
    if tally.left:
        text += f"; {tally.left} had left that state meanwhile (started, or moved on) and were left as they are"
    return _message(request, "Canceled", text, back)


async def _schedule_action(request: web.Request) -> web.Response:
    admin = request.app[ADMIN]
    name, action = request.match_info["name"], request.match_info["action"]
    log.info("dashboard: %s of schedule %s by %s", action, name, caller(request))
    if action == "trigger":
        job_id = await run_async(admin.redis, trigger(admin.namespace, name, request.app[CONFIG].max_payload_bytes))
        if job_id is None:
            return _message(request, "Nothing done", f"no schedule {name}", "/ui/schedules", 404)
        return _message(request, "Triggered", f"schedule {name} enqueued job {job_id}", "/ui/schedules")
    result = await run_async(admin.redis, change(admin.namespace, name, action))
    if result < 0:
        return _message(request, "Nothing done", f"no schedule {name}", "/ui/schedules", 404)
    word = "paused" if action == "pause" else "resumed"
    text = f"schedule {name} is {word}" if result else f"schedule {name} was already {word}: nothing changed"
    return _message(request, word.capitalize(), text, "/ui/schedules")
