"""The operators' actions on the store, for every surface: the CLI (through asyncio.run), the HTTP API and
the web dashboard act through `Admin`, which reads through `AdminReads`.

Every action is a transition script, atomic and fenced like the daemon's own: cancel (one job, or the jobs a
filter matches, in bounded steps), pause and resume, requeue and purge dead jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobcar.admin_reads import AdminReads
from jobcar.job import State
from jobcar.job_search import JobFilter
from jobcar.keys import QueueKeys
from jobcar.replies import as_int
from jobcar.scripts import ScriptCall
from jobcar.transitions import (
    BULK_LIMIT,
    CancelResult,
    cancel_call,
    cancel_many_call,
    parse_cancel,
    parse_cancel_many,
    pause_call,
    purge_call,
    requeue_call,
)
from jobcar.transport import execute_async


@dataclass(frozen=True, slots=True)
class CancelReply:
    queue: str
    result: CancelResult
    #: The job's state before the cancel; None for a job that was gone.
    before: State | None


#: The states a bulk cancel empties: a job in them has not started (an active one is never touched by it).
CANCELABLE: Final = (State.PENDING, State.HELD, State.SCHEDULED, State.WAITING)
#: Jobs a bulk cancel looks at per step, and cancels at most per script call.
CANCEL_STEP: Final = 500


@dataclass(slots=True)
class BulkCancel:
    """What a bulk cancel did (or, in a dry run, would do) in one queue and state."""

    queue: str
    state: State
    #: Jobs looked at, and those that matched the filter.
    examined: int = 0
    matched: int = 0
    #: Jobs deleted; jobs that matched but had left the state when their step ran (leased, promoted...), left
    #: as they are.
    canceled: int = 0
    left: int = 0

    def document(self) -> dict[str, Any]:
        return {"queue": self.queue, "state": self.state.value, "examined": self.examined, "matched": self.matched,
                "canceled": self.canceled, "left": self.left}  # fmt: skip


class Admin(AdminReads):
    """Reads (`AdminReads`) and operator actions on one namespace."""

    async def cancel(self, job_id: str, queue: str | None = None) -> CancelReply:
        queue, _ = await self.locate(job_id, queue)
        (reply,) = await execute_async(self.redis, [cancel_call(self.keys(queue), job_id)])
        result, before = parse_cancel(reply)
        return CancelReply(queue, result, before)

    async def cancel_matching(
        self, queues: Sequence[str], states: Sequence[State], job_filter: JobFilter, dry_run: bool = False
    ) -> list[BulkCancel]:
        """Cancel the jobs of these states of these queues that match, in bounded steps (`cancel_queue_state`);
        with `dry_run`, count them and change nothing."""
        return [await self.cancel_queue_state(q, s, job_filter, dry_run) for q in queues for s in states]

    async def cancel_queue_state(
        self, queue: str, state: State, job_filter: JobFilter, dry_run: bool = False
    ) -> BulkCancel:
        """One pass over a state's jobs, newest first, CANCEL_STEP at a time: their fields read, matched, and the
        matching ones canceled by one `cancel_many` call, which deletes only those still in that state, so a job
        a daemon leases meanwhile runs on. The newest end is where no lease takes jobs from, so jobs leaving
        meanwhile do not move the pass past others; jobs enqueued meanwhile may be met again (they are looked
        at twice, never canceled twice) or not at all. Bounded: at most twice the jobs the state held at the
        start, and a step more."""
        if state not in CANCELABLE:
            raise ValueError(f"a bulk cancel takes pending, held, scheduled or waiting jobs, not {state.value}")
        tally = BulkCancel(queue, state)
        (stats,) = await self.stats([queue])
        bound = 2 * stats.in_state(state) + CANCEL_STEP
        keys = self.keys(queue)
        position = 0
        while tally.examined < bound:
            located = await self.located(queue, state, position, CANCEL_STEP, newest_first=True)
            if not located:
                break
            ids = [job_id for job_id, _ in located]
            chosen = located
            if job_filter.any:
                values = await self.fields(queue, ids, job_filter.fields)
                chosen = [p for p, f in zip(located, values, strict=True) if job_filter.match(p[0], f, stats.now_ms)]
            tally.examined += len(ids)
            tally.matched += len(chosen)
            canceled = 0
            if chosen and not dry_run:
                (reply,) = await execute_async(self.redis, [cancel_many_call(keys, state, chosen)])
                canceled, left = parse_cancel_many(reply)
                tally.canceled += canceled
                tally.left += left
            position += len(ids) - canceled  # the canceled ones were before the next position
            if len(ids) < CANCEL_STEP:
                break
        return tally

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause or resume leasing from `queue`; whether that changed anything."""
        (reply,) = await execute_async(self.redis, [pause_call(self.keys(queue), paused)])
        return as_int(reply) == 1

    async def requeue_dead(self, queues: Sequence[str], job_ids: Sequence[str]) -> tuple[dict[str, int], list[str]]:
        """Run these dead jobs again: (jobs moved per queue, why some ids were not moved)."""
        return await self._bulk_dead(queues, job_ids, requeue_call)

    async def _bulk_dead(
        self, queues: Sequence[str], job_ids: Sequence[str], bulk: Callable[[QueueKeys, Sequence[str]], ScriptCall]
    ) -> tuple[dict[str, int], list[str]]:
        by_queue: dict[str, list[str]] = {}
        problems = []
        for job_id, found in (await self._states(list(dict.fromkeys(job_ids)), queues)).items():
            dead = [queue for queue, state in found.items() if state is State.DEAD]
            for queue in dead:
                by_queue.setdefault(queue, []).append(job_id)
            if found and not dead:
                where = ", ".join(f"{state.value} in {queue}" for queue, state in found.items())
                problems.append(f"job {job_id} is not dead ({where})")
            elif not found:
                problems.append(f"no such job {job_id}")
        moved = {}
        for queue, ids in by_queue.items():
            keys = self.keys(queue)
            calls = [bulk(keys, ids[i : i + BULK_LIMIT]) for i in range(0, len(ids), BULK_LIMIT)]
            moved[queue] = sum(as_int(reply) for reply in await execute_async(self.redis, calls))
        return moved, problems

    async def purge_dead(self, queues: Sequence[str], job_ids: Sequence[str]) -> tuple[dict[str, int], list[str]]:
        """Delete these dead jobs for good: (jobs deleted per queue, why some ids were not deleted)."""
        return await self._bulk_dead(queues, job_ids, purge_call)

    async def requeue_all_dead(self, queue: str) -> int:
        """Run every job dead now in `queue` again; how many."""
        return await self._drain_dead(queue, requeue=True)

    async def purge_all_dead(self, queue: str) -> int:
        """Delete every job dead now in `queue` for good; how many."""
        return await self._drain_dead(queue, requeue=False)

    async def _drain_dead(self, queue: str, requeue: bool) -> int:
        keys = self.keys(queue)
        bulk = requeue_call if requeue else purge_call
        # Bounded by the count taken first: jobs that die meanwhile stay. Otherwise a requeued job that
        # fails again at once, under a running daemon, could keep this loop going.
        remaining = int(await self.redis.zcard(keys.dead))
        done = 0
        while remaining > 0:
            (reply,) = await execute_async(self.redis, [bulk(keys, (), min(BULK_LIMIT, remaining))])
            moved = as_int(reply)
            if moved == 0:
                break
            done += moved
            remaining -= moved
        return done
