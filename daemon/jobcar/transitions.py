"""The transitions of a stored job (lease, extend, ack, retry, kill, reap, requeue, purge, cancel, pause)
and the queue's reads (stats, history, job fields), each a script call to build and a reply to parse: pure
functions, no I/O.

Each transition that changes a job's state is one Lua script in `lua/` (docs/protocol.md has each
script's KEYS/ARGV/return contract). Building a call and parsing its reply are plain functions, so
the producer client, the CLI, the HTTP API and the daemon share one implementation and differ only in
how they send the calls (`transport`). Storing jobs is `enqueueing`'s; the calls of jobs that wait for
others are `dependency_calls`'.

Only the standard library and redis-py are imported: producers cancel a batch's callbacks with `cancel`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Final, cast

from jobcar.job import Job, State
from jobcar.keys import QueueKeys
from jobcar.replies import as_bytes, as_int, as_list, as_text
from jobcar.scripts import Arg, Reply, ScriptCall, call

#: Jobs moved per requeue/purge call; "all" repeats the call until nothing is left.
BULK_LIMIT: Final = 1000


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    max_jobs: int = 10_000
    max_age_ms: int = 180 * 86400 * 1000


@dataclass(frozen=True, slots=True)
class LeasedJob:
    job: Job
    token: str


@dataclass(frozen=True, slots=True)
class LeaseResult:
    now_ms: int
    jobs: list[LeasedJob]
    #: Milliseconds until the earliest scheduled job is due; None when nothing is scheduled.
    next_due_ms: int | None
    paused: bool
    #: The lease was given the caller's alive key and found it gone: it took nothing, changed nothing.
    declined: bool
    #: (id, why) for ids that were in the pending list and are not runnable: no job hash, or a key that
    #: holds another type (corruption). Dropped from the list; a key left behind is fsck's to report.
    dropped: list[tuple[str, str]]
    #: Ids whose start deadline (`expires_at`) passed before they were first leased: moved to the dead set.
    expired: list[str]
    #: Leased jobs whose hash cannot be read (a producer wrote bad fields): (id, token, problem).
    #: The caller should kill them; they are leased, so nothing else will run them meanwhile.
    malformed: list[tuple[str, str, str]]


def lease_call(
    keys: QueueKeys,
    count: int,
    lease_ms: int,
    default_max_attempts: int,
    max_attempts_by_type: str = "{}",
    alive_key: str | None = None,
    dead: DeadLetterLimits = DeadLetterLimits(),
    limits: str = "{}",
) -> ScriptCall:
    """`max_attempts_by_type` is a JSON object type -> max_attempts (encode it once per config). With
    `alive_key`, the lease takes nothing unless that key exists (ADR 0005). `dead` trims the dead set when
    the lease moves an expired job there. `limits` are the fleet-wide concurrency limits
    (`config_types.limit_rules`)."""
    token_base = secrets.token_hex(8)
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.wake, keys.paused)
    return call(
        "lease",
        script_keys if alive_key is None else (*script_keys, alive_key),
        (keys.prefix, count, lease_ms, token_base, default_max_attempts, max_attempts_by_type, dead.max_jobs,
         dead.max_age_ms, limits),
    )  # fmt: skip


def parse_lease(keys: QueueKeys, reply: Reply) -> LeaseResult:
    now, next_due, stopped, dropped, expired, *jobs = as_list(reply)
    leased = []
    malformed = []
    for raw in jobs:
        items = as_list(raw)
        job_id, token = items[0], items[1]
        try:
            # One iterator over the name/value pairs after id and token: no slices copied (a hot path: every
            # leased job). Zipped with itself, strict: a name without a value is a ValueError.
            pairs = iter(items)
            next(pairs), next(pairs)
            if len(items) == 2 or type(items[2]) is bytes:  # a client without decode_responses (jobcar's own)
                fields = dict(zip(cast(Iterator[bytes], pairs), cast(Iterator[bytes], pairs), strict=True))
            else:
                fields = {as_bytes(name): as_bytes(value) for name, value in zip(pairs, pairs, strict=True)}
            if not fields.get(b"type"):
                raise ValueError("the job has no type")
            leased.append(LeasedJob(Job.from_hash(as_text(job_id), keys.queue, fields), as_text(token)))
        except (ValueError, KeyError, TypeError) as exc:
            malformed.append((as_text(job_id), as_text(token), str(exc)))
    due = as_int(next_due)
    return LeaseResult(
        now_ms=as_int(now),
        jobs=leased,
        next_due_ms=None if due < 0 else due,
        paused=as_int(stopped) == 1,
        declined=as_int(stopped) == 2,
        dropped=[(as_text(i), as_text(why)) for i, why in (as_list(d) for d in as_list(dropped))],
        expired=[as_text(i) for i in as_list(expired)],
        malformed=malformed,
    )


class ExtendStatus(IntEnum):
    LOST = 0
    RENEWED = 1
    CANCEL_REQUESTED = 2


def extend_call(keys: QueueKeys, lease_ms: int, leases: Iterable[tuple[str, str]]) -> ScriptCall:
    args: list[Arg] = [keys.prefix, lease_ms]
    for job_id, token in leases:
        args += [job_id, token]
    return call("extend", (keys.active,), args)


def parse_extend(reply: Reply) -> list[ExtendStatus]:
    """One status per lease passed to extend_call, in order."""
    _now, *statuses = as_list(reply)
    return [ExtendStatus(as_int(s)) for s in statuses]


def ack_call(
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    result: bytes | None = None,
    retention_ms: int = 0,
    final: State = State.DONE,
) -> ScriptCall:
    """Ack one job; `merge_acks` turns several of one queue into one call. The reply: `parse_ack`."""
    if final not in (State.DONE, State.CANCELED):
        raise ValueError(f"ack finishes a job as done or canceled, not {final}")
    args = (keys.prefix, job_id, token, final.value, retention_ms, result or b"")
    return call("ack", (keys.active, keys.job(job_id)), args)


def merge_acks(acks: Sequence[ScriptCall]) -> ScriptCall:
    """One ack call for the jobs of several (of one queue): the script takes one or many jobs, and a
    round trip under load then costs one script call instead of one per finished job."""
    first = acks[0]
    if any(a.script.name != "ack" or a.keys[0] != first.keys[0] for a in acks):
        raise ValueError("merge_acks takes ack calls of one queue")
    keys = (first.keys[0], *(key for a in acks for key in a.keys[1:]))
    args = (first.args[0], *(arg for a in acks for arg in a.args[1:]))
    return ScriptCall(first.script, keys, args)


#: An ack's or a kill's reply for a job that ended while jobs in other queues waited for it (its queue's
#: `settled` list has an entry, for the settler to carry).
ENDED_AND_TELLS: Final = 2


def parse_ack(reply: Reply) -> list[int]:
    """One value per job of the call, in order: 1 finished, 2 (ENDED_AND_TELLS) finished and jobs in other
    queues waited for it, 0 lease lost (nothing changed)."""
    return [as_int(r) for r in as_list(reply)]


def coalesce(calls: Sequence[ScriptCall]) -> list[tuple[ScriptCall, list[int]]]:
    """The calls to send for `calls`: acks of one queue merged into one, every other call as it is.
    Each comes with the positions (in `calls`) of the calls it carries; `split_reply` undoes it."""
    sent: list[tuple[ScriptCall, list[int]]] = []
    acks_by_queue: dict[str, list[int]] = {}
    for position, c in enumerate(calls):
        if c.script.name == "ack":
            acks_by_queue.setdefault(c.keys[0], []).append(position)
        else:
            sent.append((c, [position]))
    for positions in acks_by_queue.values():
        sent.append((merge_acks([calls[p] for p in positions]), positions))
    return sent


def split_reply(sent: ScriptCall, reply: Reply, count: int) -> list[Reply]:
    """The replies of the `count` calls that `sent` carried (see `coalesce`): an ack's per-job values,
    or the one reply of any other call. An error reply is every carried call's reply."""
    if sent.script.name != "ack" or isinstance(reply, Exception):
        return [reply] * count
    return list(parse_ack(reply))


class RetryResult(IntEnum):
    LOST = 0
    RETRIED = 1
    DEAD = 2
    DEAD_AND_TELLS = 3  # moved to dead, and jobs in other queues wait for it: its queue's `settled` has an entry


def retry_call(
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    delay_ms: int,
    error: str,
    spend_attempt: bool = True,
    max_free_retries: int = 0,
    dead: DeadLetterLimits = DeadLetterLimits(),
    hold: HoldBack | None = None,
) -> ScriptCall:
    """`max_free_retries` bounds how many attempts a job may give back in its life (0: no bound). `hold`
    holds the job's type or key back for the delay too (a handler's 429, `limits.on_429`)."""
    held = () if hold is None else (hold.scope, hold.key_source, hold.burst_ms)
    return call(
        "retry",
        (keys.active, keys.pending, keys.scheduled, keys.dead, keys.wake, keys.job(job_id)),
        (keys.prefix, job_id, token, max(0, delay_ms), error, "1" if spend_attempt else "0",
         dead.max_jobs, dead.max_age_ms, max_free_retries, *held),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class HoldBack:
    """Which group a handler's 429 holds back: "type" or "key" (read from the job by `key_source`, as the
    lease's rules), and that group's rate interval × (burst - 1) in ms (0 without a rate)."""

    scope: str
    key_source: str
    burst_ms: int


def kill_call(
    keys: QueueKeys, job_id: str, token: str, reason: str, dead: DeadLetterLimits = DeadLetterLimits()
) -> ScriptCall:
    return call(
        "kill",
        (keys.active, keys.dead, keys.job(job_id)),
        (keys.prefix, job_id, token, reason, dead.max_jobs, dead.max_age_ms),
    )


def reap_call(
    keys: QueueKeys,
    *,
    limit: int = 1000,
    default_max_attempts: int = 10,
    dead: DeadLetterLimits = DeadLetterLimits(),
    limits: str = "{}",
) -> ScriptCall:
    """`limits` as for `lease_call`: the pass also gives back slots whose jobs left active and lets held
    jobs go up to their groups' free slots."""
    return call(
        "reap",
        (keys.active, keys.pending, keys.dead, keys.wake),
        (keys.prefix, limit, dead.max_jobs, dead.max_age_ms, default_max_attempts, limits),
    )


@dataclass(frozen=True)
class Reaped:
    """What one reap call did: job id -> where it went ("pending", "dead" or "missing"), and the seconds
    until the earliest lease still held expires (None when no job is active; 0 when more are due now)."""

    moved: dict[str, str]
    next_expiry_in: float | None


def parse_reap(reply: Reply) -> Reaped:
    next_expiry_in, moved = as_list(reply)
    flat = [as_text(x) for x in as_list(moved)]
    milliseconds = as_int(next_expiry_in)
    return Reaped(dict(zip(flat[::2], flat[1::2], strict=True)), None if milliseconds < 0 else milliseconds / 1000)


def requeue_call(keys: QueueKeys, job_ids: Sequence[str] = (), limit: int = BULK_LIMIT) -> ScriptCall:
    return call("requeue", (keys.dead, keys.pending, keys.wake), (keys.prefix, limit, *job_ids))


def purge_call(keys: QueueKeys, job_ids: Sequence[str] = (), limit: int = BULK_LIMIT) -> ScriptCall:
    return call("purge", (keys.dead,), (keys.prefix, limit, *job_ids))


class CancelResult(StrEnum):
    CANCELED = "canceled"
    CANCEL_REQUESTED = "cancel_requested"
    NOT_CANCELABLE = "not_cancelable"
    MISSING = "missing"


def cancel_call(keys: QueueKeys, job_id: str) -> ScriptCall:
    return call("cancel", (keys.pending, keys.scheduled, keys.job(job_id)), (keys.prefix, job_id))


def parse_cancel(reply: Reply) -> tuple[CancelResult, State | None]:
    """(what cancel did, the job's state before it; None for a missing job)."""
    result, state = (as_text(x) for x in as_list(reply))
    return CancelResult(result), State(state) if state else None


def cancel_many_call(keys: QueueKeys, state: State, located: Sequence[tuple[str, int]]) -> ScriptCall:
    """A bulk cancel's step: these jobs deleted if still in `state` (pending, scheduled, held or waiting). Each
    (id, index): where a pending or held job was read in its list, from the left (`AdminReads.located`), or -1."""
    return call("cancel_many", (keys.pending, keys.scheduled),
                (keys.prefix, state.value, *(str(x) for pair in located for x in pair)))  # fmt: skip


def parse_cancel_many(reply: Reply) -> tuple[int, int]:
    """(jobs canceled, jobs left as they were: no longer in that state, or gone)."""
    canceled, left = as_list(reply)
    return as_int(canceled), as_int(left)


def pause_call(keys: QueueKeys, paused: bool) -> ScriptCall:
    return call("pause", (keys.paused, keys.wake), (keys.prefix, "1" if paused else "0"))


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    now_ms: int
    pending: int
    scheduled: int
    active: int
    dead: int
    paused: bool
    #: When the longest-waiting runnable job became runnable (None: nothing waits).
    oldest_ready_ms: int | None
    #: Jobs waiting for a slot of a fleet-wide concurrency limit (ADR 0014).
    held: int = 0
    #: The same by job type (types with none held are absent).
    held_by_type: dict[str, int] = field(default_factory=dict)
    #: Jobs waiting for others to end (`after`, ADR 0016).
    waiting: int = 0
    #: The backpressure bound of the pending and held jobs, as Redis holds it (None: none; ADR 0024).
    max_pending: int | None = None
    #: Jobs enqueue refused by that bound and by the types' bounds, ever, by every producer.
    refused: int = 0
    #: Job type -> its jobs pending or held, the count a type's bound holds (<prefix>pending_counts; a type
    #: with none is absent).
    pending_counts: dict[str, int] = field(default_factory=dict)
    #: Job type -> the backpressure bound of its pending and held jobs, as Redis holds it (a type without one
    #: is absent; `handlers.<type>.max_pending`).
    max_pending_by_type: dict[str, int] = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        """Age of the oldest runnable job, in seconds (0 when nothing waits)."""
        return 0.0 if self.oldest_ready_ms is None else max(0, self.now_ms - self.oldest_ready_ms) / 1000

    def in_state(self, state: State) -> int:
        """How many jobs a state's set (or lists) holds (not `done`: no such count is kept here)."""
        counts = {State.PENDING: self.pending, State.SCHEDULED: self.scheduled, State.ACTIVE: self.active,
                  State.DEAD: self.dead, State.WAITING: self.waiting, State.HELD: self.held}  # fmt: skip
        return counts[state]


def stats_call(keys: QueueKeys) -> ScriptCall:
    return call("stats", (keys.pending, keys.scheduled, keys.active, keys.dead, keys.paused), (keys.prefix,))


def parse_stats(keys: QueueKeys, reply: Reply) -> QueueStats:
    values = as_list(reply)
    # By position: a later version of the script may append elements (docs/protocol.md).
    now, pending, scheduled, active, dead, paused, oldest, held = (as_int(x) for x in values[:8])
    by_type, waiting, max_pending, refused, typed = values[8:13]
    pairs, triples = as_list(by_type), as_list(typed)
    counts = {as_text(triples[i]): as_int(triples[i + 1]) for i in range(0, len(triples), 3)}
    bounds = {as_text(triples[i]): as_int(triples[i + 2]) for i in range(0, len(triples), 3)}
    return QueueStats(
        queue=keys.queue,
        now_ms=now,
        pending=pending,
        scheduled=scheduled,
        active=active,
        dead=dead,
        paused=paused == 1,
        oldest_ready_ms=None if oldest < 0 else oldest,
        held=held,
        held_by_type={as_text(pairs[i]): as_int(pairs[i + 1]) for i in range(0, len(pairs), 2)},
        waiting=as_int(waiting),
        max_pending=None if as_int(max_pending) < 0 else as_int(max_pending),
        refused=as_int(refused),
        pending_counts={job_type: n for job_type, n in counts.items() if n > 0},
        max_pending_by_type={job_type: n for job_type, n in bounds.items() if n >= 1},
    )


def job_fields_call(keys: QueueKeys, fields: Sequence[str], job_ids: Sequence[str]) -> ScriptCall:
    """Chosen fields of many jobs; the reply: `parse_job_fields`."""
    return call("job_fields", (keys.job(""),), (keys.prefix, len(fields), *fields, *job_ids))


def parse_job_fields(fields: Sequence[str], job_ids: Sequence[str], reply: Reply) -> list[dict[bytes, bytes]]:
    """Each job's fields that exist, by name, in the order of `job_ids`."""
    values = as_list(reply)
    names = [f.encode() for f in fields]
    n = len(names)
    return [
        {name: as_bytes(v) for name, v in zip(names, values[i * n : (i + 1) * n], strict=True) if v is not None}
        for i in range(len(job_ids))
    ]
