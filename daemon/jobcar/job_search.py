"""Jobs found by a filter in bounded steps, for every surface (the CLI, the HTTP API, the dashboard): a state's
jobs walked by position in the order they leave it, the fields a filter needs read a chunk at a time in one
call (`job_fields`) and matched here; each walk looks at a bounded number of jobs and says how far it looked
and where the next one starts (a position, the cursor). Plain reads only.

A position counts from the end the state's jobs leave by (the next out first). Jobs that leave the state
meanwhile (a daemon leases them) move the ones behind them forward, so a walk continued from a cursor may
skip as many as left; jobs that arrive join at the other end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from jobcar.admin_reads import AdminReads
from jobcar.errors import InvalidJob
from jobcar.job import DEFAULT_CONTENT_TYPE, Job, State, parse_errors
from jobcar.replies import as_text

#: The states a walk by position covers: every set or list that holds jobs (done jobs are in none).
WALKABLE: Final = (State.PENDING, State.HELD, State.SCHEDULED, State.ACTIVE, State.WAITING, State.DEAD)
#: Jobs a filtered walk looks at, at most, unless asked for another bound.
SCAN_BUDGET: Final = 5000
#: The most a caller may ask a walk to look at.
MAX_SCAN_BUDGET: Final = 100_000
#: Jobs whose fields are read per round trip while filtering.
CHUNK: Final = 500
#: Done jobs (in no set) are found by SCAN: its COUNT per step, and the most steps a walk sends.
DONE_STEP: Final = 1000
DONE_STEPS: Final = 100


#: What a condition's path starts with: a field of the job's JSON payload, or a value of its meta.
SOURCES: Final = ("payload", "meta")


@dataclass(frozen=True, slots=True)
class Condition:
    """`payload.<field>[.<field>...]=<value>` or `meta.<name>=<value>`: a field of the job's JSON object payload
    (dots walk into nested objects) or a meta value, equal to the text. A string equals its own text; any other
    JSON value its JSON text (`42`, `true`, `null`, `[1,2]`), and a number also any number text of the same value
    (`42` and `42.0`). A payload that is not a JSON object, or lacks the field, never matches."""

    source: str
    path: tuple[str, ...]
    value: str

    def __str__(self) -> str:
        return f"{self.source}.{'.'.join(self.path)}={self.value}"

    def match(self, fields: Mapping[bytes, bytes]) -> bool:
        if self.source == "meta":
            meta = _json(fields.get(b"meta"))
            found = meta.get(self.path[0], _MISSING) if isinstance(meta, dict) else _MISSING
        else:
            content_type = as_text(fields.get(b"content_type", DEFAULT_CONTENT_TYPE.encode()))
            if content_type.partition(";")[0].strip().lower() != DEFAULT_CONTENT_TYPE:
                return False
            found = _json(fields.get(b"payload"))
            for name in self.path:
                found = found.get(name, _MISSING) if isinstance(found, dict) else _MISSING
        return found is not _MISSING and _equals(found, self.value)


_MISSING: Final = object()


def _json(raw: bytes | None) -> object:
    if raw is None:
        return _MISSING
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return _MISSING


def _equals(found: object, text: str) -> bool:
    if isinstance(found, str):
        return found == text
    if isinstance(found, int | float) and not isinstance(found, bool):
        try:
            return float(text) == found
        except ValueError:
            return False
    return json.dumps(found, separators=(",", ":"), ensure_ascii=False) == text


def parse_condition(text: str) -> Condition:
    """A condition as written: `payload.customer=42`, `payload.address.city=Lyon`, `meta.tenant=acme`."""
    path, equals, value = text.partition("=")
    source, _, rest = path.partition(".")
    names = tuple(rest.split(".")) if rest else ()
    if not equals or source not in SOURCES or not names or not all(names):
        raise InvalidJob(f"a condition is payload.<field>=<value> or meta.<name>=<value>, not {text!r}")
    if source == "meta" and len(names) > 1:
        raise InvalidJob(f"meta is flat: meta.<name>=<value>, not {text!r}")
    return Condition(source, names, value)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a job must match; every part given must (the empty filter matches every job)."""

    job_type: str = ""
    error: str = ""  # text the last error holds (case-insensitive)
    id_prefix: str = ""
    #: The producer's limit key (`key=`).
    key: str = ""
    #: Only jobs enqueued at least this long ago (ms, by Redis time); 0: any.
    older_than_ms: int = 0
    where: tuple[Condition, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.job_type or self.error or self.id_prefix or self.key or self.older_than_ms or self.where)

    @property
    def fields(self) -> tuple[str, ...]:
        """The job hash's fields `match` reads (`type` always: every stored job has one, so a job gone is told
        apart from one without the others)."""
        wanted = ["type", "errors"] if self.error else ["type"]
        if self.key:
            wanted.append("key")
        if self.older_than_ms:
            wanted.append("created")
        sources = {c.source for c in self.where}
        if "payload" in sources:
            wanted += ["payload", "content_type"]
        if "meta" in sources:
            wanted.append("meta")
        return tuple(wanted)

    def match(self, job_id: str, fields: Mapping[bytes, bytes], now_ms: int = 0) -> bool:
        """Whether the job with these fields (`fields`, read from its hash; {} for one gone) matches."""
        if not fields:
            return False
        if self.id_prefix and not job_id.startswith(self.id_prefix):
            return False
        if self.job_type and as_text(fields.get(b"type", b"")) != self.job_type:
            return False
        if self.key and as_text(fields.get(b"key", b"")) != self.key:
            return False
        if self.older_than_ms:
            created = fields.get(b"created", b"")
            if not created.isdigit() or int(created) > now_ms - self.older_than_ms:
                return False
        if self.error:
            error = last_error(fields)
            if error is None or self.error.lower() not in error.lower():
                return False
        return all(condition.match(fields) for condition in self.where)

    def describe(self) -> str:
        """The filter in words, for confirmations and notes."""
        parts = [f"of type {self.job_type}"] if self.job_type else []
        parts += [f"with key {self.key}"] if self.key else []
        parts += [f"whose id starts with {self.id_prefix}"] if self.id_prefix else []
        parts += [f"enqueued over {self.older_than_ms / 1000:g}s ago"] if self.older_than_ms else []
        parts += [f"whose last error holds “{self.error}”"] if self.error else []
        parts += [f"where {c}" for c in self.where]
        return ", ".join(parts) if parts else "every job"


def last_error(fields: Mapping[bytes, bytes]) -> str | None:
    """The last attempt's error, from a job's `errors` field."""
    try:
        errors = parse_errors(fields.get(b"errors"))
    except (ValueError, KeyError, TypeError):
        return "(the job's error history cannot be read)"
    return errors[-1].error if errors else None


@dataclass(slots=True)
class Found:
    """What one walk found in one queue and state."""

    jobs: list[Job] = field(default_factory=list)
    #: Where the next walk starts (the cursor), or None: this one reached the state's end.
    next_start: int | None = None
    #: Jobs looked at (more than found when filtering).
    examined: int = 0
    #: Jobs in the state when the walk began (None for done jobs: no set counts them).
    total: int | None = 0
    #: For done jobs: how many keys of the SCAN step at `next_start` (a SCAN cursor) this walk already took.
    next_skip: int = 0
    #: Why some jobs found could not be read (a hash written around the scripts), one line each.
    unreadable: list[str] = field(default_factory=list)
    #: Redis time when the walk began, the clock every stored time was taken with.
    now_ms: int = 0


async def find(
    reads: AdminReads,
    queue: str,
    state: State,
    job_filter: JobFilter,
    start: int = 0,
    limit: int = 50,
    budget: int = SCAN_BUDGET,
    newest_first: bool = False,
) -> Found:
    """Up to `limit` jobs of `state` in `queue` that match, from position `start` on, looking at no more than
    `budget` jobs when filtering (without a filter, the next `limit`)."""
    if state not in WALKABLE:
        raise ValueError(f"no set holds {state.value} jobs")
    (stats,) = await reads.stats([queue])
    found = Found(total=stats.in_state(state), now_ms=stats.now_ms)
    position = start
    filtering = job_filter.any
    budget = budget if filtering else limit
    total = stats.in_state(state)
    while True:
        if position >= total:
            return found
        if len(found.jobs) >= limit or found.examined >= budget:
            found.next_start = position
            return found
        want = min(CHUNK, budget - found.examined) if filtering else limit - len(found.jobs)
        ids = await reads.ids(queue, state, position, want, newest_first)
        if not ids:
            return found
        if filtering:
            values = await reads.fields(queue, ids, job_filter.fields)
            matching = {i for i, f in zip(ids, values, strict=True) if job_filter.match(i, f, stats.now_ms)}
        else:
            matching = set(ids)
        chosen: list[str] = []
        taken = 0
        for job_id in ids:
            taken += 1
            if job_id in matching:
                chosen.append(job_id)
                if len(found.jobs) + len(chosen) >= limit:
                    break
        if chosen:
            jobs, problems = await reads.jobs(queue, chosen)
            found.jobs += jobs
            found.unreadable += problems
        position += taken
        found.examined += taken
        if taken == len(ids) < want:  # the state's last job
            return found


async def find_done(
    reads: AdminReads,
    queue: str,
    job_filter: JobFilter,
    cursor: int = 0,
    skip: int = 0,
    limit: int = 50,
    budget: int = SCAN_BUDGET,
    now_ms: int = 0,
) -> Found:
    """Up to `limit` done jobs that match. Done jobs are in no set (their hash lives for result_ttl): found by
    SCAN, DONE_STEP keys of the keyspace a step from `cursor`, until `limit` were found, or `budget` of the
    queue's job keys or DONE_STEPS steps were looked at. A walk that fills in the middle of a step says where in
    it the next one starts (`next_skip`: a step sent again from the same cursor finds the same keys, unless the
    keyspace changed meanwhile); SCAN knows no order, so the jobs come in no order."""
    found = Found(total=None, now_ms=now_ms)
    for _ in range(DONE_STEPS):
        step = cursor
        cursor, ids = await reads.job_keys_page(queue, step, DONE_STEP, job_filter.id_prefix)
        skip = min(skip, len(ids))  # the step found fewer keys than when the last walk was made
        values = await reads.fields(queue, ids, ("state", *job_filter.fields))
        chosen: list[str] = []
        for index in range(skip, len(ids)):
            if values[index].get(b"state") == b"done" and job_filter.match(ids[index], values[index], now_ms):
                chosen.append(ids[index])
                if len(found.jobs) + len(chosen) >= limit:
                    await _take(reads, queue, chosen, found)
                    found.examined += index + 1 - skip
                    if index + 1 < len(ids):
                        found.next_start, found.next_skip = step, index + 1
                    elif cursor != 0:
                        found.next_start = cursor
                    return found
        found.examined += len(ids) - skip
        skip = 0
        await _take(reads, queue, chosen, found)
        if cursor == 0:
            return found
        if found.examined >= budget:
            break
    found.next_start = cursor
    return found


async def _take(reads: AdminReads, queue: str, ids: list[str], found: Found) -> None:
    if ids:
        jobs, problems = await reads.jobs(queue, ids)
        found.jobs += jobs
        found.unreadable += problems
