"""What each dashboard page shows, read through `Admin` and the fleet's entries; no HTTP here.

A page never reads more than a bounded number of jobs: a queue is paged by its sets' positions (a filter
examines at most SCAN_BUDGET jobs per page and says where it stopped), and the dead-letter groups are made
from the newest GROUP_LIMIT dead jobs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jobcar.admin import Admin
from jobcar.fleet import DaemonInfo, live_daemons
from jobcar.history_calls import QueueHistory
from jobcar.job import Job, State
from jobcar.job_search import CHUNK, SCAN_BUDGET, JobFilter, find, find_done, last_error
from jobcar.replies import as_text
from jobcar.transitions import QueueStats

PAGE_SIZE: Final = 50
#: Dead jobs the groups by type and error are made from (the newest).
GROUP_LIMIT: Final = 10_000
#: An error text is grouped by its first line, cut to this many characters.
ERROR_KEY_CHARS: Final = 120
MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000
#: The states a queue page lists, in the order of its tabs.
LISTED: Final = (State.PENDING, State.HELD, State.SCHEDULED, State.ACTIVE, State.WAITING, State.DEAD, State.DONE)


@dataclass(frozen=True, slots=True)
class QueueSummary:
    stats: QueueStats
    #: Minute starts (Redis ms) of the last hour, oldest first, and the attempts done and failed in each.
    minutes: list[int]
    done: list[int]
    failed: list[int]

    def document(self) -> dict[str, Any]:
        s = self.stats
        return {
            "queue": s.queue, "pending": s.pending, "scheduled": s.scheduled, "active": s.active,
            "waiting": s.waiting, "dead": s.dead, "held": s.held, "paused": s.paused, "latency_s": s.latency_s,
            "minutes": self.minutes, "done": self.done, "failed": self.failed,
            "done_last_hour": sum(self.done), "failed_last_hour": sum(self.failed),
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Overview:
    queues: list[QueueSummary]
    daemons: list[DaemonInfo]
    now_ms: int

    def document(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "queues": [q.document() for q in self.queues],
            "daemons": [
                {"id": d.id, "host": d.host, "pid": d.pid, "version": d.version, "queues": list(d.queues),
                 "concurrency": d.concurrency, "in_flight": d.in_flight, "started_ms": d.started_ms}
                for d in self.daemons
            ],
        }  # fmt: skip


async def overview(admin: Admin) -> Overview:
    """Every queue's counts and last hour, and the live daemons."""
    queues = await admin.queues()
    # Three independent reads, sent together: the page polls this every 5 s.
    stats, histories, daemons = await asyncio.gather(
        admin.stats(queues), admin.history(queues), live_daemons(admin.redis, admin.namespace)
    )
    now_ms = max((s.now_ms for s in stats), default=0)
    summaries = [_summary(s, h) for s, h in zip(stats, histories, strict=True)]
    return Overview(summaries, daemons, now_ms)


def _summary(stats: QueueStats, history: QueueHistory) -> QueueSummary:
    this_minute = history.now_ms // MINUTE_MS * MINUTE_MS
    minutes = [this_minute - MINUTE_MS * n for n in range(59, -1, -1)]
    first = minutes[0]
    done, failed = [0] * 60, [0] * 60
    for (slot_ms, _job_type, outcome), n in history.counts.items():
        index = (slot_ms - first) // MINUTE_MS
        if 0 <= index < 60 and outcome in ("done", "failed"):
            (done if outcome == "done" else failed)[index] += n
    return QueueSummary(stats, minutes, done, failed)


@dataclass(frozen=True, slots=True)
class TypeHour:
    """One job type's finished attempts in a queue over the last hour (whole 10 s slots), fleet-wide."""

    job_type: str
    done: int
    failed: int  # retried or dead
    dead: int


def by_type(history: QueueHistory) -> list[TypeHour]:
    """The last hour of a queue's history per job type, by type name."""
    hour = history.by_type(HOUR_MS)
    return [TypeHour(kind, c["done"], c["failed"], c["dead"]) for kind, c in sorted(hour.items()) if any(c.values())]


#: A queue page's filters (job_search.py); all optional, all must match.
Filters = JobFilter


@dataclass(slots=True)
class Browse:
    """One page of a queue's jobs in one state."""

    jobs: list[Job] = field(default_factory=list)
    #: Where the next page starts (a position in the state's order; for done jobs a SCAN cursor), or None.
    next_start: int | None = None
    #: For done jobs: how many keys of the SCAN step at `next_start` this page already took.
    next_skip: int = 0
    #: Jobs looked at for this page (more than shown when filtering).
    examined: int = 0
    #: Jobs in this state (None for done jobs: no set counts them).
    total: int | None = None
    unreadable: list[str] = field(default_factory=list)

    async def take(self, admin: Admin, queue: str, ids: Sequence[str]) -> None:
        """Add these jobs as they are now (those gone meanwhile are left out, unreadable ones named)."""
        if ids:
            jobs, problems = await admin.jobs(queue, ids)
            self.jobs += jobs
            self.unreadable += problems


async def browse(
    admin: Admin, stats: QueueStats, state: State, start: int, filters: Filters, newest_first: bool, skip: int = 0
) -> Browse:
    """Up to PAGE_SIZE jobs of `state` from position `start`, examining at most SCAN_BUDGET when filtering.
    For done jobs, `start` and `skip` are where a page left off (`Browse.next_start`, `Browse.next_skip`)."""
    if state is State.DONE:
        return await _browse_done(admin, stats.queue, start, skip, filters, stats.now_ms)
    found = await find(admin, stats.queue, state, filters, start, PAGE_SIZE, SCAN_BUDGET, newest_first)
    return Browse(found.jobs, found.next_start, 0, found.examined, found.total, found.unreadable)


def _matches(job_id: str, fields: dict[bytes, bytes], filters: Filters, now_ms: int = 0) -> bool:
    """Whether a job whose fields these are passes the filters (one gone never does)."""
    return filters.match(job_id, fields, now_ms)


async def _browse_done(admin: Admin, queue: str, cursor: int, skip: int, filters: Filters, now_ms: int) -> Browse:
    """A page of done jobs (job_search.find_done), newest first within the page (SCAN knows no order across
    pages)."""
    found = await find_done(admin, queue, filters, cursor, skip, PAGE_SIZE, SCAN_BUDGET, now_ms)
    found.jobs.sort(key=lambda job: job.finished_ms or 0, reverse=True)
    return Browse(found.jobs, found.next_start, found.next_skip, found.examined, None, found.unreadable)


@dataclass(frozen=True, slots=True)
class DeadGroups:
    """A queue's dead jobs counted by type and by error (the last error's first line)."""

    by_type: list[tuple[str, int]]
    by_error: list[tuple[str, int]]
    counted: int
    total: int
    limit: int = GROUP_LIMIT


async def dead_groups(admin: Admin, queue: str, total: int) -> DeadGroups:
    """The groups of the newest GROUP_LIMIT dead jobs, largest first."""
    by_type: Counter[str] = Counter()
    by_error: Counter[str] = Counter()
    counted = 0
    async for _, fields in _newest_dead(admin, queue, total):
        counted += 1
        by_type[as_text(fields.get(b"type", b""))] += 1
        by_error[error_key(last_error(fields) or "")] += 1
    return DeadGroups(by_type.most_common(), by_error.most_common(), counted, total)


def error_key(error: str) -> str:
    """What dead jobs are grouped by: the first line of the error, cut short."""
    return error.strip().partition("\n")[0][:ERROR_KEY_CHARS]


async def dead_matching(admin: Admin, queue: str, filters: Filters) -> list[str]:
    """The ids of the dead jobs the filter matches among the newest GROUP_LIMIT: what a bulk action by filter
    acts on, from the jobs the groups count."""
    return [job_id async for job_id, fields in _newest_dead(admin, queue) if _matches(job_id, fields, filters)]


async def _newest_dead(
    admin: Admin, queue: str, total: int = GROUP_LIMIT
) -> AsyncIterator[tuple[str, dict[bytes, bytes]]]:
    """The newest of a queue's dead jobs (at most GROUP_LIMIT, and `total` when the count is known), with their
    `type` and `errors` fields, CHUNK a call; jobs gone meanwhile are left out."""
    for start in range(0, min(total, GROUP_LIMIT), CHUNK):
        ids = await admin.ids(queue, State.DEAD, start, CHUNK, newest_first=True)
        for job_id, fields in zip(ids, await admin.fields(queue, ids, ("type", "errors")), strict=True):
            if fields:
                yield job_id, fields
        if len(ids) < CHUNK:
            return
