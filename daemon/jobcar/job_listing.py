"""`jobcar jobs list` without a search (that is `job_search.py`): the first jobs of each queue and state in the
order they leave it, of one type when asked; done jobs, which no set holds, newest first (a SCAN of the queue's
job keys, each read for its state and when it finished); a job's children, from its children set. Plain reads,
through `AdminReads`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from jobcar.admin_reads import AdminReads
from jobcar.job import Job, State
from jobcar.keys import QueueKeys, split_job_ref
from jobcar.names import NAME_PATTERN
from jobcar.replies import as_text

#: Ids read per round trip while a listing looks for jobs of one type, or for done jobs.
LIST_PAGE: Final = 500
#: What a listing of done jobs reads of each job before it reads the newest whole.
_DONE_FIELDS: Final = ("state", "type", "finished")


@dataclass(slots=True)
class JobListing:
    jobs: list[Job] = field(default_factory=list)
    #: Why a listed job cannot be read (its hash was written around the enqueue script), one line each.
    unreadable: list[str] = field(default_factory=list)
    #: (queue, state, jobs shown, jobs in that state, or -1 when more may match a type filter) where the
    #: limit left some out.
    partial: list[tuple[str, State, int, int]] = field(default_factory=list)
    #: Redis time, the clock every stored time was taken with.
    now_ms: int = 0


async def list_jobs(
    reads: AdminReads, queues: Sequence[str], states: Sequence[State], limit: int, job_type: str | None = None
) -> JobListing:
    """Up to `limit` jobs per queue and state (of `job_type` only, when given), in the order they will
    leave it: pending in run order, the sorted sets by score (run-at, lease deadline, died-at); done
    jobs (kept while `result_ttl` holds their result) newest first."""
    listing = JobListing()
    stats = await reads.stats(queues)
    listing.now_ms = max((s.now_ms for s in stats), default=0)
    for queue_stats in stats:
        keys = reads.keys(queue_stats.queue)
        for state in states:
            if state is State.DONE:
                await _list_done(reads, keys, limit, job_type, listing)
                continue
            total = queue_stats.in_state(state)
            seen, found = 0, 0
            while seen < total and found < limit:
                # Without a type filter one page is the answer; with one, pages go on until enough match.
                page = await reads.ids(keys.queue, state, seen, limit if job_type is None else LIST_PAGE)
                if not page:
                    break
                seen += len(page)
                jobs, problems = await reads.jobs(keys.queue, page)
                listing.unreadable += problems
                for job in jobs:
                    if found < limit and (job_type is None or job.type == job_type):
                        listing.jobs.append(job)
                        found += 1
            if seen < total and job_type is None:
                listing.partial.append((keys.queue, state, seen, total))
            elif seen < total:
                listing.partial.append((keys.queue, state, found, -1))  # more may match
    return listing


async def _list_done(reads: AdminReads, keys: QueueKeys, limit: int, job_type: str | None, listing: JobListing) -> None:
    """Done jobs are in no set (their hash lives for result_ttl): found by SCAN, newest first. Only the
    newest `limit` are read whole."""
    prefix = len(keys.job(""))
    ids = sorted({as_text(k)[prefix:] async for k in reads.redis.scan_iter(match=keys.all_jobs(), count=1000)})
    finished: list[tuple[int, str]] = []
    for start in range(0, len(ids), LIST_PAGE):
        page = ids[start : start + LIST_PAGE]
        for job_id, fields in zip(page, await reads.fields(keys.queue, page, _DONE_FIELDS), strict=True):
            if fields.get(b"state") == b"done" and (job_type is None or fields.get(b"type") == job_type.encode()):
                at = fields.get(b"finished", b"")
                finished.append((int(at) if at.isdigit() else 0, job_id))  # unreadable ones are named below
    finished.sort(reverse=True)
    jobs, problems = await reads.jobs(keys.queue, [job_id for _, job_id in finished[:limit]])
    listing.jobs += jobs
    listing.unreadable += problems
    if len(finished) > limit:
        listing.partial.append((keys.queue, State.DONE, limit, len(finished)))


async def list_children(
    reads: AdminReads, parent: str, limit: int, keep: Callable[[Job], bool] = lambda job: True
) -> tuple[JobListing, int]:
    """The first `limit` children (oldest first) that `keep` keeps of the job `parent` names
    ("[<queue>/]<id>", found by `locate` without a queue), read from its children set, not by a scan; and how
    many children it has in all. Children that are gone (ended without a kept result, canceled) are not
    listed; the listing's `partial` is not used."""
    parent_queue, parent_id = parse_parent(parent)
    parent_queue, _ = await reads.locate(parent_id, parent_queue)
    key = reads.keys(parent_queue).children(parent_id)
    listing = JobListing(now_ms=await reads.now_ms())
    total = await reads.redis.zcard(key)
    found, start = 0, 0
    while found < limit and start < total:
        refs = [as_text(m) for m in await reads.redis.zrange(key, start, start + LIST_PAGE - 1)]
        if not refs:
            break
        start += len(refs)
        by_queue: dict[str, list[str]] = {}
        for ref in refs:
            child_queue, child_id = split_job_ref(ref)
            by_queue.setdefault(child_queue, []).append(child_id)
        read: dict[str, Job] = {}
        for child_queue, ids in by_queue.items():
            jobs, problems = await reads.jobs(child_queue, ids)
            listing.unreadable += problems
            read.update({f"{job.queue}/{job.id}": job for job in jobs})
        for ref in refs:
            if ref in read and found < limit and keep(read[ref]):
                listing.jobs.append(read[ref])
                found += 1
    return listing, total


def parse_parent(ref: str) -> tuple[str | None, str]:
    """(queue or None, id) of "[<queue>/]<id>": with a slash, the part before it is the queue when it is a
    queue name (a queue name holds no slash; an id may)."""
    queue, slash, job_id = ref.partition("/")
    if slash and job_id and NAME_PATTERN.fullmatch(queue):
        return queue, job_id
    return None, ref
