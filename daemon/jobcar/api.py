"""The daemon's own HTTP listener: probes, metrics, the enqueue API and the job document.

    GET    /healthz        200 {"status": "ok"}: the event loop answers
    GET    /readyz         200 {"status": "ready"} | 503 {"status": "not ready", "reason": ...}
    GET    /metrics        200 the Prometheus text exposition
    POST   /v1/jobs        a job, or {"jobs": [...]} (MAX_BATCH_JOBS of enqueue_request.py, one call): 201 created
                           | 200 that id exists, or debounced into the waiting job {"id", "status": "debounced"}
                           | 409 duplicate unique job | 400 bad input | 413 too large
                           | 415 not Content-Type: application/json
                           | 429 the queue is at its max_pending (Retry-After; ADR 0024)
    GET    /v1/jobs/{id}   200 the job (job_document.job_document) | 404 | 409 in several queues  (?queue=Q: only there;
                           ?wait=30s: answer once it is done or dead, or after 30 s; header Jobcar-Wait says which)
    DELETE /v1/jobs/{id}   200 canceled or cancel_requested | 404 | 409 already finished, or in several queues
    POST   /v1/drain       202 {"status": "draining"}: a graceful drain, for a preStop hook
    GET    /v1/stats       200 [per queue: pending, scheduled, active, held, waiting, dead, paused, ...]: the
                           document of `jobcar stats --json` (stats_document.stats_document) | 404 (?queue=Q: only Q,
                           which Redis or the config must know)
    GET    /v1/jobs?state= a page of one state's jobs of a queue, filtered, held ones with their limit group, and
    POST   /v1/jobs/cancel the jobs not yet running that a filter matches canceled (a dry run counts): api_jobs.py
    /v1/schedules...       periodic jobs: api_schedules.py
    /v1/attempts/{id}/...  the handler API: what a running attempt's handler may do (handler_api.py), with
                           the attempt's own token instead of the api_token
    /ui/...                the web dashboard (ui/pages.py), with its own rules for browsers and sessions

Every error is JSON {"error": "..."}. Redis refusing a write (OOM under noeviction, a replica...) or unreachable
is a 503, and the enqueue script was refused whole: nothing is half-written. With a token set (`api_token`,
`api_tokens`), all but the three probes need `Authorization: Bearer <token>` (reads too: payloads are data), 401
without a token in force, 403 with one whose role does not allow the route (api_tokens.py: GET needs read,
POST /v1/jobs produce, every other write operate); without any they are open, which the daemon only allows on
loopback (`check_exposure`). The log lines of actions name the token (never its value). No token, password or
payload is ever logged.

Web pages are refused on every route before the token is looked at (browser_guard.py, ADR 0009): 421 for a Host
that is not a loopback name, an IP address or one of `api_allowed_hosts` while the API is open; 403 for a request
a browser sent for a page of another origin (`Origin`, `Sec-Fetch-Site`); 415 for a POST /v1/jobs body that is
not `Content-Type: application/json`. jobcar answers no CORS preflight, so a page can send it no JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

from aiohttp import hdrs, web
from redis import exceptions as redis_errors

from jobcar import tracing
from jobcar.admin import Admin
from jobcar.admin_reads import AmbiguousJob, JobNotFound
from jobcar.api_fields import duration_field
from jobcar.api_jobs import add_job_routes
from jobcar.api_schedules import add_schedule_routes
from jobcar.api_tokens import CALLER, Tokens, allows, caller, required_role, token_table
from jobcar.attempt_desk import AttemptDesk
from jobcar.browser_guard import cross_site_problem, host_problem
from jobcar.client import AsyncClient
from jobcar.config_types import Config, limit_rule_table
from jobcar.enqueue_request import parse_enqueue_request
from jobcar.errors import InvalidJob, PayloadTooLarge, QueueFull
from jobcar.formats import redact
from jobcar.handler_api import add_handler_routes, is_attempt_route
from jobcar.job import FINISHED, EnqueueStatus, JobInfo, State
from jobcar.keys import DEFAULT_QUEUE
from jobcar.listen import exposure_problem, parse_listen
from jobcar.names import ID_PATTERN, check_name
from jobcar.stats_document import stats_document
from jobcar.targets import KnownTargets
from jobcar.transitions import CancelResult
from jobcar.ui.pages import build_ui_app

log = logging.getLogger("jobcar.api")

#: A request body (a job or a whole batch) holds at most 2 × max_payload_bytes + this (base64 and JSON escapes
#: take room). That also bounds how long parsing it holds the event loop: tens of ms at worst (json keeps the GIL).
BODY_MARGIN_BYTES: Final = 64 * 1024
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PUBLIC_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})  # kubelet probes, Prometheus scrapes
#: Where the web dashboard is mounted (ui/pages.py), unless the config's `ui.enabled` is false.
UI_PREFIX: Final = "/ui"
#: The longest `GET /v1/jobs/{id}?wait=` holds a request (a client asks again for longer).
MAX_WAIT: Final = 60.0
SHUTDOWN_TIMEOUT: Final = 5.0  # for in-flight requests when the listener is cleaned up

# Redis errors that mean "not now" rather than "bad request": by class where redis-py has one (it strips the
# code off those replies: OOM, READONLY, LOADING, ...), else by the reply's code.
_UNAVAILABLE_CODES: Final = ("MISCONF", "BUSY", "NOREPLICAS")
_UNAVAILABLE: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, redis_errors.ClusterError,
                       redis_errors.OutOfMemoryError, redis_errors.ReadOnlyError, redis_errors.TryAgainError,
                       redis_errors.ClusterDownError, redis_errors.MasterDownError, OSError)  # fmt: skip


@dataclass(frozen=True)
class ApiContext:
    """What the listener needs from the daemon."""

    config: Config
    #: Bound to the daemon's Redis and namespace, made with max_payload_bytes=config.max_payload_bytes.
    client: AsyncClient
    #: (ready?, reason): Redis reachable, config loaded, app healthy.
    readiness: Callable[[], Awaitable[tuple[bool, str]]]
    #: Starts a graceful drain. Called on every POST /v1/drain, so it must be idempotent.
    drain: Callable[[], None]
    #: The Prometheus text exposition, already rendered.
    metrics: Callable[[], Awaitable[bytes]]
    #: The running attempts, for the handler API (handler_api.py).
    desk: AttemptDesk = dataclasses.field(default_factory=AttemptDesk)
    #: The OpenMetrics exposition (its histograms carry exemplars), for a scraper that asks for it; None: the
    #: Prometheus text only (tracing off: no exemplar to show).
    openmetrics: Callable[[], Awaitable[bytes]] | None = None
    #: The API tokens in force, which the daemon replaces on reload; None: the config's, for good.
    tokens: Tokens | None = None


CONTEXT: Final = web.AppKey("jobcar.api.context", ApiContext)
ADMIN: Final = web.AppKey("jobcar.api.admin", Admin)
TARGETS: Final = web.AppKey("jobcar.api.targets", KnownTargets)
TOKENS: Final = web.AppKey("jobcar.api.tokens", Tokens)
Handler: TypeAlias = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(context: ApiContext) -> web.Application:
    """The routes above, with JSON errors and the token check, and the request body capped (BODY_MARGIN_BYTES)."""
    if context.client.max_payload_bytes != context.config.max_payload_bytes:
        raise ValueError("the API's AsyncClient must be made with max_payload_bytes=config.max_payload_bytes")
    max_body = 2 * context.config.max_payload_bytes + BODY_MARGIN_BYTES
    # With tracing on, a request's traceparent is the parent of the spans it makes (tracing.py); off, no layer.
    traced = [_trace_context] if tracing.active is not None else []
    app = web.Application(middlewares=[_json_errors, _refuse_web_pages, _auth, *traced], client_max_size=max_body)
    app[CONTEXT] = context
    app[ADMIN] = Admin(context.client.redis, context.client.namespace, context.config.queues)
    app[TARGETS] = context.config.known_targets()  # once: every enqueue request is checked against it
    app[TOKENS] = context.tokens or Tokens(token_table(context.config))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/jobs", _enqueue)
    app.router.add_get("/v1/jobs/{id:.+}", _get_job)  # `.+`: an id may hold a slash (docs/protocol.md)
    app.router.add_delete("/v1/jobs/{id:.+}", _cancel)
    app.router.add_post("/v1/drain", _drain)
    add_job_routes(app, lambda request: request.app[ADMIN], _not_json)  # GET /v1/jobs, POST /v1/jobs/cancel
    app.router.add_get("/v1/limits", _limits)
    app.router.add_get("/v1/stats", _stats)
    add_schedule_routes(app, lambda request: request.app[CONTEXT].client, _not_json)
    # The handler API's bounds are the runner's config, which a reload changes.
    add_handler_routes(app, context.desk, lambda request: context.desk.config or request.app[CONTEXT].config,
                       lambda request: request.app[CONTEXT].client)  # fmt: skip
    if context.config.ui.enabled:
        app.router.add_get(UI_PREFIX, to_dashboard)
        app.add_subapp(UI_PREFIX, build_ui_app(app[ADMIN], context.config, app[TOKENS]))
    return app


def _is_dashboard(request: web.Request) -> bool:
    """A request for the dashboard's pages, which keeps its own rules for browsers and sessions (ui/access.py)."""
    return request.path == UI_PREFIX or request.path.startswith(UI_PREFIX + "/")


async def to_dashboard(request: web.Request) -> web.Response:
    """`/ui` (and, for `jobcar ui`, `/`) is the dashboard's overview at `/ui/`."""
    raise web.HTTPPermanentRedirect(UI_PREFIX + "/")


async def _limits(request: web.Request) -> web.Response:
    """Every limit group with a job running, held or rated, in the config's queues and those producers used."""
    groups = await request.app[ADMIN].limits(limit_rule_table(request.app[CONTEXT].config))
    return web.json_response([g.document() for g in groups])


async def _stats(request: web.Request) -> web.Response:
    """What `jobcar stats --json` prints: one document per queue (the config's and every queue producers used)."""
    admin, config, only = request.app[ADMIN], request.app[CONTEXT].config, request.query.get("queue")
    if only is not None:
        only = check_name("queue name", only)
        if only not in config.queues and only not in await admin.known_queues():
            return _error(404, f"unknown queue {only}: no producer used it, and it is not in the config")
    queues = await admin.queues(only)
    stats, histories = await asyncio.gather(admin.stats(queues), admin.history(queues))
    return web.json_response([stats_document(s, h) for s, h in zip(stats, histories, strict=True)])


async def start_listener(app: web.Application, listen: str) -> web.AppRunner:
    """Serve `app` on `listen` (port 0 takes a free one: see `bound_port`). The caller cleans the listener up."""
    host, port = parse_listen(listen)
    listener = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await listener.setup()
    try:
        await web.TCPSite(listener, host, port).start()
    except BaseException:
        await listener.cleanup()
        raise
    host = listen.rpartition(":")[0]
    log.info("listening on http://%s:%d", host, bound_port(listener))
    return listener


def bound_port(listener: web.AppRunner) -> int:
    """The port the listener got (what port 0 became)."""
    return int(listener.addresses[0][1])


def check_exposure(config: Config) -> str | None:
    """Why the daemon must not start with this listener (open routes on a reachable address), or None.
    The config loader applies the same rule, so `jobcar check` refuses what this refuses."""
    problem = exposure_problem(config.listen, config.has_api_token)
    return None if problem is None else f"{config.source}: {problem}"


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidJob as exc:
        return _error(413 if isinstance(exc, PayloadTooLarge) else 400, str(exc))
    except QueueFull as exc:  # backpressure (ADR 0024): nothing of a single job or a batch of one queue was written
        stored = [_info(info) for info in exc.stored]
        return web.json_response(
            {"error": str(exc), "queue": exc.queue, "pending": exc.pending, "max_pending": exc.max_pending,
             "refused": exc.refused, **({"type": exc.job_type} if exc.job_type is not None else {}),
             **({"jobs": stored} if stored else {})},
            status=429, headers={"Retry-After": str(exc.retry_after)},
        )  # fmt: skip
    except JobNotFound:
        return _error(404, "no such job")
    except AmbiguousJob as exc:
        return _error(409, f"{exc}; choose one with ?queue=")
    except UnicodeEncodeError:  # a lone surrogate escape ("\ud800") in an id or key cannot be sent to Redis
        return _error(400, "the request holds text that is not valid Unicode (a lone surrogate escape)")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own answers (no such route, wrong method, body over client_max_size), as JSON.
        message = (exc.text or "") if exc.status == 413 else exc.reason.lower()
        keep = {k: v for k, v in exc.headers.items() if k not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)}
        return _error(exc.status, message, keep)
    except (redis_errors.RedisError, OSError) as exc:
        detail = f"{type(exc).__name__}: {redact(str(exc))}"
        if isinstance(exc, _UNAVAILABLE) or str(exc).startswith(_UNAVAILABLE_CODES):
            log.warning("%s %s: redis unavailable: %s", request.method, request.path, detail)
            return _error(503, f"redis unavailable: {detail}")
        log.error("%s %s: redis error: %s", request.method, request.path, detail)
        return _error(500, f"redis error: {detail}")
    except Exception:
        log.exception("%s %s: unexpected error", request.method, request.path)
        return _error(500, "internal error (see the daemon's log)")


@web.middleware
async def _refuse_web_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request a browser sent for a web page never reaches a route, the probes included (browser_guard.py)."""
    if _is_dashboard(request):
        return await handler(request)
    config = request.app[CONTEXT].config
    host = request.headers.get(hdrs.HOST)
    # A bearer token is never sent by a browser on its own, so with one a rebound Host gains a page nothing; without
    # one the routes are open and Host is what tells the daemon's names from a rebound one.
    tokens = request.app[TOKENS].table
    misdirected = None if tokens.enabled else host_problem(host, config.api_allowed_hosts)
    if misdirected is not None:
        log.debug("%s %s refused: Host is not one of the daemon's names", request.method, request.path)
        return _error(421, misdirected)
    cross_site = cross_site_problem(request.headers.get(hdrs.ORIGIN), request.headers.get("Sec-Fetch-Site"), host)
    if cross_site is not None:
        log.debug("%s %s refused: sent by a browser for another site", request.method, request.path)
        return _error(403, cross_site)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The bearer token and its role (api_tokens.py); the tokens read anew on each request, as a reload changes them."""
    tokens = request.app[TOKENS].table
    # The dashboard has its own sign-in; the handler API takes the attempt's token instead.
    open_route = request.path in PUBLIC_PATHS or _is_dashboard(request) or is_attempt_route(request.path)
    if not tokens.enabled or open_route:
        return await handler(request)
    token = tokens.bearer(request.headers.get(hdrs.AUTHORIZATION))
    if token is None:
        return _error(401, "missing or wrong bearer token", {hdrs.WWW_AUTHENTICATE: 'Bearer realm="jobcar"'})
    needed = required_role(request.method, request.path)
    if not allows(token.role, needed):
        log.info("%s %s refused: token %s (role %s) is not allowed to %s", request.method, request.path, token.name,
                 token.role.value, needed.value)  # fmt: skip
        return _error(403, f"token {token.name} has role {token.role.value}: this route needs {needed.value}",
                      role=token.role.value, needed=needed.value)  # fmt: skip
    request[CALLER] = token.name
    return await handler(request)


@web.middleware
async def _trace_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The producer span of `POST /v1/jobs` (and of the children a handler makes) is a child of the request's
    `traceparent` header, the caller's span."""
    traceparent = request.headers.get("traceparent")
    if tracing.active is None or traceparent is None:
        return await handler(request)
    with tracing.active.request(traceparent):
        return await handler(request)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None, **extra: str) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    ready, reason = await request.app[CONTEXT].readiness()
    body = {"status": "ready"} if ready else {"status": "not ready", "reason": reason}
    return web.json_response(body, status=200 if ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    if context.openmetrics is not None and "application/openmetrics-text" in request.headers.get(hdrs.ACCEPT, ""):
        return web.Response(body=await context.openmetrics(), headers={hdrs.CONTENT_TYPE: OPENMETRICS_CONTENT_TYPE})
    body = await context.metrics()
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: METRICS_CONTENT_TYPE})


async def _drain(request: web.Request) -> web.Response:
    log.info("drain requested over HTTP by %s", caller(request))
    request.app[CONTEXT].drain()
    return web.json_response({"status": "draining"}, status=202)


async def _enqueue(request: web.Request) -> web.Response:
    not_json = _not_json(request)
    if not_json is not None:
        return _error(415, not_json)
    specs, batch = parse_enqueue_request(await request.read())
    # Under strict_enqueue a TargetRefused, which is an InvalidJob: a 400 naming every problem.
    problems = request.app[TARGETS].check(
        (job_type, options.get("queue") or DEFAULT_QUEUE) for job_type, _, options in specs
    )
    client = request.app[CONTEXT].client
    if batch:
        infos = await client.enqueue_many(specs)
    else:
        job_type, payload, options = specs[0]
        infos = [await client.enqueue(job_type, payload, **options)]
    if log.isEnabledFor(logging.DEBUG):
        shown = ", ".join(f"{i.id} in {i.queue} ({i.status.value})" for i in infos[:10])
        log.debug("enqueued by %s: %s%s", caller(request), shown, f" and {len(infos) - 10} more" * (len(infos) > 10))
    response: web.Response
    if batch:
        response = web.json_response({"jobs": [_info(i) for i in infos]}, status=201)
    elif infos[0].status is EnqueueStatus.DUPLICATE:
        info = infos[0]
        response = _error(409, "duplicate unique job", id=info.id, queue=info.queue, state=info.state.value)
    else:
        response = web.json_response(_info(infos[0]), status=201 if infos[0].created else 200)
    if problems:
        # A header, not a body field: the body stays what a producer parses. ASCII, as a header must be.
        response.headers["Jobcar-Warning"] = "; ".join(problems).encode("ascii", "backslashreplace").decode()
    return response


async def _get_job(request: web.Request) -> web.Response:
    job_id, queue = _job_ref(request)
    wait = request.query.get("wait")
    if wait is None:
        view = await request.app[ADMIN].job(job_id, queue)
        return web.json_response(view.document())
    # A long poll: the answer comes when the job has finished, or when the wait is over.
    seconds = duration_field("wait", wait)
    if seconds > MAX_WAIT:
        raise InvalidJob(f"wait is at most {MAX_WAIT:g}s; ask again for longer")
    view = await request.app[ADMIN].wait(job_id, queue, seconds)
    finished = view.job.state in FINISHED
    headers = {"Jobcar-Wait": "finished" if finished else "timeout"}
    return web.json_response(view.document(), headers=headers)


async def _cancel(request: web.Request) -> web.Response:
    job_id, queue = _job_ref(request)
    reply = await request.app[ADMIN].cancel(job_id, queue)
    if reply.result is CancelResult.MISSING or reply.before is None:
        return _error(404, "no such job")
    if reply.result is CancelResult.NOT_CANCELABLE:
        return _error(409, "job already finished", id=job_id, queue=reply.queue, state=reply.before.value)
    log.info("job %s in %s: %s by %s (was %s)", job_id, reply.queue, reply.result.value, caller(request),
             reply.before.value)  # fmt: skip
    # "state" is the job's state now: a canceled job is gone; a flagged one runs until its daemon stops it.
    state = State.CANCELED if reply.result is CancelResult.CANCELED else reply.before
    return web.json_response({"id": job_id, "queue": reply.queue, "result": reply.result.value, "state": state.value})


def _not_json(request: web.Request) -> str | None:
    """Why the body is not declared JSON (UTF-8), or None. A JSON body must say so: a web page can send text/plain,
    a form or multipart to any address without asking the server, but application/json only after a CORS
    preflight, which jobcar never grants."""
    # aiohttp takes a missing Content-Type for application/octet-stream. Type and charset are case-insensitive.
    if request.content_type.lower() == "application/json" and (request.charset or "utf-8").lower() == "utf-8":
        return None
    shown = request.headers.get(hdrs.CONTENT_TYPE, "none")[:100]
    return f"the body must be Content-Type: application/json (UTF-8), not {shown}"


def _job_ref(request: web.Request) -> tuple[str, str | None]:
    job_id, queue = request.match_info["id"], request.query.get("queue")
    if not ID_PATTERN.fullmatch(job_id):
        raise web.HTTPNotFound(reason="No such job")  # no job can have this id
    return job_id, check_name("queue name", queue) if queue else None


def _info(info: JobInfo) -> dict[str, str]:
    return {"id": info.id, "queue": info.queue, "state": info.state.value, "status": info.status.value}
