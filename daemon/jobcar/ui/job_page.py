"""A job's page (`/ui/job`): its document, its payload (shown in part, whole as a download from
`/ui/job/payload`), and what its handlers wrote through the handler API (progress, the log's newest lines, steps,
children), which `/ui/job.json` gives the page's script while the job runs.
"""

from __future__ import annotations

import json
from typing import Final

from aiohttp import web

from jobcar.admin import Admin
from jobcar.cli_format import byte_size, percent_text
from jobcar.job import FINISHED
from jobcar.job_view import JobView, LogRead
from jobcar.timestamps import rfc3339_ms
from jobcar.tracing import trace_link
from jobcar.ui.page_parts import ADMIN, CONFIG, job_ref, link, render

#: The payload shown on a job's page, pretty-printed; the download has all of it.
PAYLOAD_SHOWN_BYTES: Final = 64 * 1024
#: The newest lines of a job's log its page shows (`jobcar jobs logs` prints them all).
LOG_SHOWN_LINES: Final = 200


async def job(request: web.Request) -> web.Response:
    queue, job_id = job_ref(request.query)
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
        payload_link=link("/ui/job/payload", queue=queue, id=job_id), job_link=_job_link,
        live_link=link("/ui/job.json", queue=queue, id=job_id),
        trace_link=trace_link(request.app[CONFIG].tracing.trace_url, view.job.traceparent),
    )  # fmt: skip


async def _log_tail(admin: Admin, view: JobView) -> LogRead | None:
    """The newest LOG_SHOWN_LINES lines of the job's log, when it has one."""
    if not view.log_lines:
        return None
    return await admin.log_since(view.job.id, view.job.queue, last=LOG_SHOWN_LINES)


async def job_json(request: web.Request) -> web.Response:
    """What changes on a job's page while it runs, for its script: state, progress, the log's newest lines,
    steps, children. Text is the handler's own: the script writes it as text, never as HTML."""
    queue, job_id = job_ref(request.query)
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
    return link("/ui/job", queue=other, id=job_id) if slash else link("/ui/job", queue=queue, id=ref)


async def payload(request: web.Request) -> web.Response:
    queue, job_id = job_ref(request.query)
    view = await request.app[ADMIN].job(job_id, queue)
    # Always a download of opaque bytes: a payload is never rendered by the browser as a page of this origin.
    return web.Response(
        body=view.job.payload,
        content_type="application/octet-stream",
        headers={"Content-Disposition": 'attachment; filename="payload.bin"'},
    )
