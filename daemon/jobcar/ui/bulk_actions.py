"""The dashboard's bulk actions, each counted and confirmed before it is applied: a dead-letter queue's requeue
or delete (of the jobs selected, or of those a filter matches) and a queue page's cancel of the jobs of one state
that its filters match.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from jobcar.admin import CANCELABLE
from jobcar.api_tokens import caller
from jobcar.errors import InvalidJob
from jobcar.job import State
from jobcar.names import ID_PATTERN
from jobcar.ui import reads
from jobcar.ui.page_parts import ADMIN, filter_query, link, message, queue_name, read_filters, render

log = logging.getLogger("jobcar.ui")


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
        return _Bulk(queue_name(request), action, None, filters)
    ids = [i for i in form.getall("id", []) if isinstance(i, str) and ID_PATTERN.fullmatch(i)]
    return _Bulk(queue_name(request), action, ids, filters)


async def dead_confirm(request: web.Request) -> web.Response:
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
        return message(request, "Nothing selected", text, f"/ui/queues/{bulk.queue}/dead")
    return render(request, "confirm.html", bulk=bulk, count=count, group_limit=reads.GROUP_LIMIT)


async def dead_apply(request: web.Request) -> web.Response:
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
    return message(request, verb.capitalize(), text, f"/ui/queues/{bulk.queue}/dead")


async def cancel_matching(request: web.Request) -> web.Response:
    """A queue page's bulk cancel: the jobs of one state (pending, held, scheduled, waiting) its filters match.
    `confirm` counts them (a dry run) and asks; `apply` cancels what matches then, in bounded steps
    (Admin.cancel_queue_state): a job that started running meanwhile is left to run."""
    admin, queue = request.app[ADMIN], queue_name(request)
    form = await request.post()
    try:
        state = State(str(form.get("state", "")))
    except ValueError:
        state = State.DONE
    if state not in CANCELABLE:
        raise InvalidJob("a bulk cancel takes the pending, held, scheduled or waiting jobs")
    filters = read_filters(form)
    back = link(f"/ui/queues/{queue}", state=state.value, **filter_query(filters))
    if request.match_info["step"] == "confirm":
        (tally,) = await admin.cancel_matching([queue], [state], filters, dry_run=True)
        if not tally.matched:
            return message(request, "Nothing matches", f"no {state.value} job of {queue} matches", back)
        return render(request, "confirm_cancel.html", queue=queue, state=state, filters=filters, count=tally.matched,
                      what=filters.describe(), fields=filter_query(filters), back=back)  # fmt: skip
    (tally,) = await admin.cancel_matching([queue], [state], filters)
    log.info("dashboard: %d %s job(s) of %s canceled by %s (%s)", tally.canceled, state.value, queue, caller(request),
             filters.describe())  # fmt: skip
    text = f"{tally.canceled} {state.value} job{'s' if tally.canceled != 1 else ''} canceled"
    if tally.left:
        text += f"; {tally.left} had left that state meanwhile (started, or moved on) and were left as they are"
    return message(request, "Canceled", text, back)
