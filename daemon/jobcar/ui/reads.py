"""What each dashboard page shows, read through `Admin` and the fleet's entries; no HTTP here.

A page never reads more than a bounded number of jobs: a queue is paged by its sets' positions (a filter
examines at most SCAN_BUDGET jobs per page and says where it stopped), and the dead-letter groups are made
from the newest GROUP_LIMIT dead jobs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jobcar.admin import Admin, readable
from jobcar.fleet import DaemonInfo, live_daemons
from jobcar.job import Job, State, parse_errors
from jobcar.replies import as_text
from jobcar.transitions import QueueHistory, QueueStats

PAGE_SIZE: Final = 50
#: Jobs a filtered page examines at most before it shows what it found (and a link to go on).
SCAN_BUDGET: Final = 5000
#: Jobs read per round trip while filtering.
CHUNK: Final = 500
#: Dead jobs the groups by type and error are made from (the newest).
GROUP_LIMIT: Final = 10_000
#: An error text is grouped by its first line, cut to this many characters.
ERROR_KEY_CHARS: Final = 120
MINUTE_MS: Final = 60_000
#: The states a queue page lists, in the order of its tabs.
LISTED: Final = (State.PENDING, State.SCHEDULED, State.ACTIVE, State.WAITING, State.DEAD, State.DONE)


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
    stats = await admin.stats(queues)
    histories = await admin.history(queues)
    now_ms = max((s.now_ms for s in stats), default=0)
    summaries = [_summary(s, h) for s, h in zip(stats, histories, strict=True)]
    return Overview(summaries, await live_daemons(admin.redis, admin.namespace), now_ms)


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
class Filters:
    """A queue page's filters; all optional, all must match."""

    job_type: str = ""
    error: str = ""  # text the last error holds (case-insensitive)
    id_prefix: str = ""

    @property
    def any(self) -> bool:
        return bool(self.job_type or self.error or self.id_prefix)

    def match(self, job_id: str, job_type: str, last_error: str | None) -> bool:
        if self.id_prefix and not job_id.startswith(self.id_prefix):
            return False
        if self.job_type and job_type != self.job_type:
            return False
        return not self.error or (last_error is not None and self.error.lower() in last_error.lower())


@dataclass(slots=True)
class Browse:
    """One page of a queue's jobs in one state."""

    jobs: list[Job] = field(default_factory=list)
    #: Where the next page starts (a position in the state's order; for done jobs a SCAN cursor), or None.
    next_start: int | None = None
    #: Jobs looked at for this page (more than shown when filtering).
    examined: int = 0
    #: Jobs in this state (None for done jobs: no set counts them).
    total: int | None = None
    unreadable: list[str] = field(default_factory=list)


async def browse(
    admin: Admin, stats: QueueStats, state: State, start: int, filters: Filters, newest_first: bool
) -> Browse:
    """Up to PAGE_SIZE jobs of `state` from position `start`, examining at most SCAN_BUDGET when filtering."""
    if state is State.DONE:
        return await _browse_done(admin, stats.queue, start, filters)
    page = Browse(total=_count(stats, state))
    position = start
    budget = SCAN_BUDGET if filters.any else PAGE_SIZE
    while True:
        if page.total is not None and position >= page.total:
            return page
        if len(page.jobs) >= PAGE_SIZE or page.examined >= budget:
            page.next_start = position
            return page
        want = min(CHUNK, budget - page.examined) if filters.any else PAGE_SIZE - len(page.jobs)
        ids = await admin.ids(stats.queue, state, position, want, newest_first)
        if not ids:
            return page
        matching = await _matching(admin, stats.queue, ids, filters) if filters.any else set(ids)
        found: list[str] = []
        taken = 0
        for job_id in ids:
            taken += 1
            if job_id in matching:
                found.append(job_id)
                if len(page.jobs) + len(found) >= PAGE_SIZE:
                    break
        page.jobs.extend(await _jobs(admin, stats.queue, found, page))
        position += taken
        page.examined += taken
        if taken == len(ids) < want:  # the state's last job
            return page


async def _matching(admin: Admin, queue: str, ids: Sequence[str], filters: Filters) -> set[str]:
    hashes = await admin.hashes(queue, ids, ("type", "errors"))
    matching = set()
    for job_id, fields in zip(ids, hashes, strict=True):
        errors = _errors(fields.get(b"errors"))
        if filters.match(job_id, as_text(fields.get(b"type", b"")), errors[-1] if errors else None):
            matching.add(job_id)
    return matching


def _errors(raw: bytes | None) -> list[str]:
    try:
        return [e.error for e in parse_errors(raw)]
    except (ValueError, KeyError, TypeError):
        return ["(the job's error history cannot be read)"]


async def _jobs(admin: Admin, queue: str, ids: Sequence[str], page: Browse) -> list[Job]:
    jobs = []
    for job_id, fields in zip(ids, await admin.hashes(queue, ids), strict=True):
        if not fields:
            continue  # it left the state since its id was read
        job = readable(job_id, queue, fields)
        if isinstance(job, str):
            page.unreadable.append(job)
        else:
            jobs.append(job)
    return jobs


async def _browse_done(admin: Admin, queue: str, cursor: int, filters: Filters) -> Browse:
    """Done jobs are in no set (their hash lives for result_ttl): found by SCAN steps of about PAGE_SIZE keys,
    in no order, until a page is full or SCAN_BUDGET keys were looked at. A page ends with a whole step, so it
    may hold a few more than PAGE_SIZE jobs."""
    page = Browse()
    for _ in range(SCAN_BUDGET // PAGE_SIZE):
        cursor, ids = await admin.job_keys_page(queue, cursor, PAGE_SIZE)
        page.examined += len(ids)
        hashes = await admin.hashes(queue, ids, ("state", "type", "errors"))
        done = []
        for job_id, fields in zip(ids, hashes, strict=True):
            errors = _errors(fields.get(b"errors"))
            kind = as_text(fields.get(b"type", b""))
            if fields.get(b"state") == b"done" and filters.match(job_id, kind, errors[-1] if errors else None):
                done.append(job_id)
        page.jobs.extend(await _jobs(admin, queue, done, page))
        if cursor == 0:
            return page
        if len(page.jobs) >= PAGE_SIZE:
            break
    page.next_start = cursor
    return page


def _count(stats: QueueStats, state: State) -> int:
    counts = {
        State.PENDING: stats.pending, State.SCHEDULED: stats.scheduled, State.ACTIVE: stats.active,
        State.WAITING: stats.waiting, State.DEAD: stats.dead,
    }  # fmt: skip
    return counts[state]


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
    for start in range(0, min(total, GROUP_LIMIT), CHUNK):
        ids = await admin.ids(queue, State.DEAD, start, CHUNK, newest_first=True)
        for fields in await admin.hashes(queue, ids, ("type", "errors")):
            if not fields:
                continue
            counted += 1
            by_type[as_text(fields.get(b"type", b""))] += 1
            errors = _errors(fields.get(b"errors"))
            by_error[error_key(errors[-1] if errors else "")] += 1
    return DeadGroups(by_type.most_common(), by_error.most_common(), counted, total)


def error_key(error: str) -> str:
    """What dead jobs are grouped by: the first line of the error, cut short."""
    return error.strip().partition("\n")[0][:ERROR_KEY_CHARS]


async def dead_matching(admin: Admin, queue: str, filters: Filters) -> list[str]:
    """The ids of the dead jobs the filter matches among the newest GROUP_LIMIT: what a bulk action by filter
    acts on, from the jobs the groups count."""
    ids: list[str] = []
    for start in range(0, GROUP_LIMIT, CHUNK):
        page = await admin.ids(queue, State.DEAD, start, CHUNK, newest_first=True)
        matching = await _matching(admin, queue, page, filters)
        ids += [job_id for job_id in page if job_id in matching]
        if len(page) < CHUNK:
            break
    return ids
