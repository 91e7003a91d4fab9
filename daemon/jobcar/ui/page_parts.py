"""The parts every page of the dashboard is made of: what a request names (a queue, a job, a Next link's
position, a queue page's filters), and how a page answers (the app's keys, the templates with their filters,
`render`, a message with the way back, links).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from jobcar.admin import Admin
from jobcar.cli_format import byte_size, percent_text, span
from jobcar.config_types import Config
from jobcar.errors import InvalidJob
from jobcar.job_search import parse_condition
from jobcar.keys import DEFAULT_NAMESPACE
from jobcar.names import ID_PATTERN, check_name
from jobcar.timestamps import rfc3339_ms
from jobcar.ui import reads
from jobcar.ui.access import ACCESS, CSRF_FIELD, SESSION_COOKIE
from jobcar.units import parse_duration

_HERE: Final = Path(__file__).parent
ADMIN: Final = web.AppKey("jobcar.ui.admin", Admin)
CONFIG: Final = web.AppKey("jobcar.ui.config", Config)
TEMPLATES: Final = web.AppKey("jobcar.ui.templates", jinja2.Environment)


def templates() -> jinja2.Environment:
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


def message(request: web.Request, title: str, text: str, back: str, status: int = 200) -> web.Response:
    """What an action did (or why it did nothing), with the way back."""
    return render(request, "message.html", status, title=title, text=text, back=back)


def queue_name(request: web.Request) -> str:
    return check_name("queue name", request.match_info["queue"])


def job_ref(values: Mapping[str, Any]) -> tuple[str, str]:
    queue, job_id = check_name("queue name", values.get("queue")), values.get("id")
    if not isinstance(job_id, str) or not ID_PATTERN.fullmatch(job_id):
        raise InvalidJob("a job id is needed")
    return queue, job_id


def number(query: Mapping[str, str], name: str) -> int:
    """A paging value of a Next link (`start`: a position in a state's order, or a SCAN cursor), below 2**63."""
    text = query.get(name, "0")
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) >= 2**63:
        raise InvalidJob(f"{name} must be a number from a Next link")
    return int(text)


def link(path: str, **query: object) -> str:
    kept = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


def read_filters(values: Mapping[str, Any]) -> reads.Filters:
    """A queue page's filters from its query (or a bulk form): type, error text, id prefix, key, age (`older`,
    a duration) and one search condition (`where`: payload.FIELD=VALUE or meta.NAME=VALUE)."""
    text = {name: str(values.get(name, "")).strip() for name in ("type", "error", "id", "key", "older", "where")}
    try:
        older_than_ms = int(parse_duration(text["older"]) * 1000) if text["older"] else 0
    except (ValueError, OverflowError) as exc:
        raise InvalidJob(f"older than: {exc}") from None
    where = (parse_condition(text["where"]),) if text["where"] else ()
    return reads.Filters(text["type"], text["error"], text["id"], text["key"], older_than_ms, where)


def filter_query(filters: reads.Filters) -> dict[str, str]:
    """The query that gives back these filters (`read_filters`)."""
    return {"type": filters.job_type, "error": filters.error, "id": filters.id_prefix, "key": filters.key,
            "older": f"{filters.older_than_ms / 1000:g}s" if filters.older_than_ms else "",
            "where": str(filters.where[0]) if filters.where else ""}  # fmt: skip
