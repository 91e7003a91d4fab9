"""`jobcar fsck`: check one queue's keys against the invariants of docs/protocol.md, and repair them.

The check reads with plain commands (SCAN for the job hashes and unique locks, then the four state
sets), so under a running daemon its picture is not one instant: a job acked or leased between two
reads may look inconsistent for a moment. That is why every repair is a small Lua script
(`lua/repair/<kind>.lua`) that first re-checks, atomically and against the current data, the very
condition it repairs, and does nothing when it no longer holds (a transition meanwhile fixed or
replaced it). A script is atomic in Redis:
no daemon transition can run between its check and its writes, so a repair never overwrites a newer
state with one computed from a stale read. A finding whose condition was gone when its repair ran was
a passing view, not corruption, and is dropped from the result.

Repairs touch only keys of the queue's hash tag, so each script stays in one Cluster slot.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from redis.exceptions import ResponseError

from jobcar.dependencies import BATCH_REF_PREFIX
from jobcar.job import STORED_IN_SETS, State
from jobcar.keys import QueueKeys, job_ref, split_job_ref
from jobcar.replies import as_int, as_text, time_ms
from jobcar.scripts import call
from jobcar.transitions import DeadLetterLimits, DependOutcome, depend_call, settle_call
from jobcar.transport import AsyncRedis, execute_async

__all__ = ["Finding", "Kind", "check_queue"]

#: A repaired done/canceled hash without a TTL, or a unique lock without one (its unique_for is
#: unknown), expires after this long.
REPAIR_TTL_MS: Final = 86400 * 1000
#: A waiting job younger than this is left alone: its producer may still be storing the jobs it waits for.
SETTLING_MS: Final = 60_000
SCAN_COUNT: Final = 1000
_CHUNK: Final = 500


class Kind:
    """The kinds of finding (the `kind` of a Finding)."""

    SEVERAL_SETS: Final = "several_sets"  # an id in two or more of the state sets
    MISSING_HASH: Final = "missing_hash"  # an id in a set without a job hash
    ORPHAN_HASH: Final = "orphan_hash"  # a pending/scheduled/dead/waiting hash in no set
    NO_TTL: Final = "no_ttl"  # a done/canceled hash that never expires
    BAD_STATE: Final = "bad_state"  # a hash in no set whose state is missing or unknown
    STATE_MISMATCH: Final = "state_mismatch"  # the hash's state is not the one set it is in
    ACTIVE_WITHOUT_LEASE: Final = "active_without_lease"  # active, but no token or no deadline entry
    DUPLICATE_PENDING: Final = "duplicate_pending"  # an id listed more than once in pending
    STALE_UNIQUE: Final = "stale_unique"  # a unique lock pointing at a missing or finished job
    UNIQUE_NO_TTL: Final = "unique_no_ttl"  # a unique lock that never expires
    DEAD_OVER_LIMIT: Final = "dead_over_limit"  # the dead set beyond max_jobs or max_age
    WRONG_TYPE: Final = "wrong_type"  # a key holding another Redis type than jobcar writes there
    SCHEDULE_MISSING: Final = "schedule_missing"  # a name in the schedules ZSET without its hash
    SCHEDULE_UNINDEXED: Final = "schedule_unindexed"  # a live schedule whose next tick the ZSET lacks
    LEAKED_SLOT: Final = "leaked_slot"  # a concurrency slot held for a job that is not active
    LOST_DEPENDENCY: Final = "lost_dependency"  # a waiting job's dependency that will never tell it it ended
    WAITING_FOR_NOTHING: Final = "waiting_for_nothing"  # a waiting job with no dependency left


@dataclass(frozen=True, slots=True)
class Finding:
    queue: str
    kind: str
    #: The job id; for unique-lock and wrong_type findings the key; "dead" for the dead set's bounds.
    job_id: str
    detail: str
    repaired: bool = False

    def line(self) -> str:
        return f"{self.queue} {self.kind} {self.job_id}: {self.detail}" + (" [repaired]" if self.repaired else "")

    def as_json(self) -> dict[str, object]:
        return {
            "queue": self.queue,
            "kind": self.kind,
            "id": self.job_id,
            "detail": self.detail,
            "repaired": self.repaired,
        }


async def _check_schedules(
    client: AsyncRedis, keys: QueueKeys, zset_usable: bool, found: Callable[..., Awaitable[None]]
) -> None:
    """Every schedule neither paused nor finished is in the ZSET at its next tick (else no daemon fires it),
    and every name there has a hash."""
    indexed: dict[str, int] = {}
    if zset_usable:
        read = client.pipeline(transaction=False)
        read.zrange(keys.schedules, 0, -1, withscores=True)
        (members,) = await read.execute()
        indexed = {as_text(member): int(score) for member, score in members}
    prefix = keys.schedule("")
    names = [key[len(prefix) :] for key in await _scan(client, keys.all_schedules())]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(keys.schedule(name), "next", "paused")
    replies = await pipe.execute(raise_on_error=False)
    live: dict[str, int | None] = {}
    for name, reply in zip(names, replies, strict=True):
        if isinstance(reply, ResponseError):
            (kind,) = await _types(client, [keys.schedule(name)])
            await found(Kind.WRONG_TYPE, keys.schedule(name), f"schedule holds a {kind}, not a hash", "", kind, "hash")
            continue
        waits_at, paused = (None if v is None else as_text(v) for v in reply)
        live[name] = int(waits_at) if waits_at and paused != "1" else None
    for name, score in sorted(indexed.items()):
        if name not in live:
            await found(Kind.SCHEDULE_MISSING, name, "in the schedules ZSET without a schedule hash", score)
    for name, next_tick in sorted(live.items()):
        if next_tick is not None and indexed.get(name) != next_tick:
            await found(Kind.SCHEDULE_UNINDEXED, name, f"waits at tick {next_tick} but the ZSET says "
                        f"{indexed.get(name, 'nothing')}: no daemon would fire it then", next_tick)  # fmt: skip


#: The states of a job that has not ended: it tells the jobs its dependents SET names when it does.
_RUNNING: Final = frozenset({"pending", "scheduled", "active", "held", "waiting"})


async def _check_waiting(
    client: AsyncRedis,
    keys: QueueKeys,
    waiting: Sequence[tuple[str, float]],
    now: int,
    dead_limits: DeadLetterLimits,
    found: Callable[..., Awaitable[None]],
) -> None:
    """Each dependency a waiting job still waits for will tell it it ended (ADR 0016): a job that has not
    ended and names it among its dependents, an ending that waits in its queue's settled list, or a batch
    that has not fired. One that will not (a producer that died between storing the job and registering
    it, keys deleted by hand, a refused settle) is settled as the producer would: registered if it has not
    ended, else told how it ended, a dependency that no longer exists counting as gone (failed). A waiting
    job that waits for nothing runs."""
    for job_id, created in waiting:
        if created > now - SETTLING_MS:
            continue
        refs = sorted(as_text(m) for m in await _members(client, keys.deps(job_id)))
        if not refs:
            await found(Kind.WAITING_FOR_NOTHING, job_id, "waiting, with no dependency left to wait for")
        for ref in refs:
            what = await _why_silent(client, keys, job_id, ref)
            if what is not None:
                repair_by = functools.partial(_settle_lost, client, keys, job_id, ref, dead_limits)
                await found(Kind.LOST_DEPENDENCY, job_id, f"waits for {ref}, {what}", repair_by=repair_by)


async def _why_silent(client: AsyncRedis, keys: QueueKeys, job_id: str, ref: str) -> str | None:
    """Why the dependency `ref` of the waiting job will never tell it it ended, or None when it will."""
    queue, dep_id = split_job_ref(ref)
    dep_keys = QueueKeys.of(keys.namespace, queue)
    why = await _why_not_told(client, dep_keys, dep_id, job_ref(keys.queue, job_id))
    # An ending script pushes its entry in the same step as it ends the job: read after a look that found it
    # ended (or gone), the settled list holds the entry if there is one. Only a suspect's queue is read.
    if why is None or dep_id in await _ending_ids(client, dep_keys):
        return None
    return why


async def _why_not_told(client: AsyncRedis, dep_keys: QueueKeys, dep_id: str, waiting_ref: str) -> str | None:
    """Why the dependency itself will not tell the waiting job (its ending may still wait in the list)."""
    if dep_id.startswith(BATCH_REF_PREFIX):
        batch_key = dep_keys.batch(dep_id.removeprefix(BATCH_REF_PREFIX))
        if not await client.exists(batch_key):
            return "a batch that no longer exists"
        try:
            fired = await client.hget(batch_key, "fired")
        except ResponseError:
            return "a batch whose counters are not a hash"
        return None if fired is None else "a batch that ended without telling it"
    try:
        state = await client.hget(dep_keys.job(dep_id), "state")
    except ResponseError:
        state = None
    if state is None:
        return "a job that no longer exists"
    if as_text(state) not in _RUNNING:
        return f"a job {as_text(state)} without telling it"
    if not await client.sismember(dep_keys.dependents(dep_id), waiting_ref):
        return "a job that does not name it among its dependents"
    return None


async def _ending_ids(client: AsyncRedis, keys: QueueKeys) -> set[str]:
    """The ids whose ending waits in the queue's settled list (a list of another type holds none)."""
    try:
        entries = await client.lrange(keys.settled, 0, -1)
    except ResponseError:
        return set()
    ids: set[str] = set()
    for entry in entries:
        try:
            ended = json.loads(entry)[0]
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if isinstance(ended, list):
            ids.update(i for i in ended if isinstance(i, str))
    return ids


async def _settle_lost(client: AsyncRedis, keys: QueueKeys, job_id: str, ref: str, dead: DeadLetterLimits) -> int:
    """What the producer does for a dependency enqueued earlier: register the waiting job with it, or tell the
    waiting job how it ended. 0 when an ending turned up meanwhile (the settler carries it) or the job no
    longer waits for it."""
    queue, dep_id = split_job_ref(ref)
    dep_keys = QueueKeys.of(keys.namespace, queue)
    counts = ""
    if dep_id.startswith(BATCH_REF_PREFIX):
        batch = dep_id.removeprefix(BATCH_REF_PREFIX)
        outcome, counts = await _batch_ending(client, dep_keys, batch)
    else:
        (reply,) = await execute_async(client, [depend_call(dep_keys, dep_id, job_ref(keys.queue, job_id))])
        outcome = as_text(reply)
        if outcome == DependOutcome.REGISTERED:
            return 1
    # An ending pushed since the check (the dependency ended just now) is the settler's to carry: read after
    # the dependency's state, it is there if the ending was.
    if dep_id in await _ending_ids(client, dep_keys):
        return 0
    (told,) = await execute_async(client, [settle_call(keys, job_id, [ref], outcome, dead, counts)])
    return 0 if as_text(told) == "ignored" else 1


async def _batch_ending(client: AsyncRedis, keys: QueueKeys, batch: str) -> tuple[str, str]:
    """How a batch ended, as its callbacks are told it (outcome, counts JSON); gone when its counters are."""
    try:
        fired, *counts = await client.hmget(keys.batch(batch), "fired", "total", "done", "dead", "canceled")
    except ResponseError:
        return DependOutcome.GONE.value, ""
    if fired is None:
        return DependOutcome.GONE.value, ""
    total, done, dead, canceled = (int(c or 0) for c in counts)
    document = {"queue": keys.queue, "batch": batch, "total": total, "done": done, "dead": dead, "canceled": canceled}
    return ("done" if dead + canceled == 0 else "dead"), json.dumps(document, separators=(",", ":"))


# -- repairs --------------------------------------------------------------------------------------


async def _repair(client: AsyncRedis, keys: QueueKeys, kind: str, *args: str | int) -> int:
    """Run `lua/repair/<kind>.lua`: 1 (or a count) when it repaired, 0 when the condition was gone."""
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.dead, keys.wake, keys.schedules)
    (reply,) = await execute_async(client, [call(f"repair/{kind}", script_keys, (keys.prefix, *args))])
    return as_int(reply)


# -- reading --------------------------------------------------------------------------------------


async def _scan(client: AsyncRedis, pattern: str) -> list[str]:
    return sorted({as_text(k) async for k in client.scan_iter(match=pattern, count=SCAN_COUNT)})


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


@dataclass(frozen=True, slots=True)
class _Hash:
    state: str | None
    token: bool
    pttl: int


async def _types(client: AsyncRedis, key_names: Sequence[str]) -> list[str]:
    pipe = client.pipeline(transaction=False)
    for key in key_names:
        pipe.type(key)
    return [as_text(t) for t in await pipe.execute()]


async def _read_hashes(
    client: AsyncRedis, keys: QueueKeys, ids: Sequence[str]
) -> tuple[dict[str, _Hash], dict[str, str]]:
    """The job hashes, and the ids whose key holds another type than a hash (id -> that type)."""
    hashes: dict[str, _Hash] = {}
    wrong: list[str] = []
    for chunk in _chunks(ids):
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["state", "token"])
            pipe.pttl(keys.job(job_id))
        replies = await pipe.execute(raise_on_error=False)
        for i, job_id in enumerate(chunk):
            fields, pttl = replies[2 * i], replies[2 * i + 1]
            if isinstance(fields, ResponseError):
                wrong.append(job_id)
                continue
            if int(pttl) == -2:
                continue  # gone since the scan
            state, token = fields
            hashes[job_id] = _Hash(None if state is None else as_text(state), token is not None, int(pttl))
    types = await _types(client, [keys.job(job_id) for job_id in wrong])
    return hashes, {job_id: kind for job_id, kind in zip(wrong, types, strict=True) if kind not in ("none", "hash")}


def _pending_name(key: str, keys: QueueKeys) -> str:
    """`pending` for the default priority's list, `pending:<p>` for the others'."""
    return State.PENDING.value + key[len(keys.pending) :]


def _set_types(keys: QueueKeys) -> dict[str, tuple[str, str]]:
    """The queue's keys that fsck reads, by name, each with the type jobcar writes there."""
    pending = {_pending_name(key, keys): (key, "list") for key in keys.pending_lists}
    return {
        **pending,
        State.SCHEDULED.value: (keys.scheduled, "zset"),
        State.ACTIVE.value: (keys.active, "zset"),
        State.DEAD.value: (keys.dead, "zset"),
        State.WAITING.value: (keys.waiting, "zset"),
        "settled": (keys.settled, "list"),
        "wake": (keys.wake, "list"),
        "schedules": (keys.schedules, "zset"),
        "limit_groups": (keys.limit_groups, "set"),
        "throttled": (keys.throttled, "zset"),
    }


async def _read_sets(
    client: AsyncRedis, keys: QueueKeys, usable: set[str]
) -> tuple[list[str], dict[str, list[tuple[str, float]]]]:
    """The ids in the pending lists (every priority's, in lease order) and the sorted sets; a key not in
    `usable` (it holds another type) reads as empty."""
    expected = _set_types(keys)
    pipe = client.pipeline(transaction=False)
    names = (State.SCHEDULED.value, State.ACTIVE.value, State.DEAD.value, State.WAITING.value)
    lists = [_pending_name(key, keys) for key in keys.pending_lists if _pending_name(key, keys) in usable]
    for name in lists:
        pipe.lrange(expected[name][0], 0, -1)
    for name in names:
        if name in usable:
            pipe.zrange(expected[name][0], 0, -1, withscores=True)
    replies = list(await pipe.execute())
    pending = [member for _ in lists for member in replies.pop(0)]
    zsets = {name: (replies.pop(0) if name in usable else []) for name in names}
    return [as_text(m) for m in pending], {
        name: [(as_text(m), float(s)) for m, s in members] for name, members in zsets.items()
    }


async def _members(client: AsyncRedis, key: str) -> set[bytes | str]:
    """A SET's members; a key of another type reads as empty (the scripts pass over it the same way)."""
    try:
        members: set[bytes | str] = await client.smembers(key)
    except ResponseError:
        return set()
    return members


async def _hash_fields(client: AsyncRedis, key: str) -> list[bytes | str]:
    """A HASH's fields; a key of another type reads as empty (the scripts pass over it the same way)."""
    try:
        fields: list[bytes | str] = await client.hkeys(key)
    except ResponseError:
        return []
    return fields


async def _limit_groups(client: AsyncRedis, keys: QueueKeys) -> list[str]:
    return sorted(as_text(m) for m in await _members(client, keys.limit_groups))


async def _held_ids(client: AsyncRedis, keys: QueueKeys, groups: list[str]) -> list[str]:
    """The ids in the held lists of `groups`; a list of another type reads as empty."""
    pipe = client.pipeline(transaction=False)
    for group in groups:
        pipe.lrange(keys.held(group), 0, -1)
    replies = await pipe.execute(raise_on_error=False)
    return [as_text(m) for reply in replies if not isinstance(reply, ResponseError) for m in reply]


async def _redis_now_ms(client: AsyncRedis) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")
    return time_ms((await pipe.execute())[0])


# -- the check ------------------------------------------------------------------------------------


async def check_queue(
    client: AsyncRedis, keys: QueueKeys, *, repair: bool, dead_limits: DeadLetterLimits
) -> list[Finding]:
    """Every inconsistency found in one queue's keys; with `repair`, each is repaired where a safe repair
    exists, and marked so. A finding whose condition was gone by the time its repair ran is left out."""
    findings: list[Finding] = []

    async def found(
        kind: str,
        job_id: str,
        detail: str,
        *repair_args: str | int,
        fixable: bool = True,
        repair_by: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        repaired = False
        if repair and fixable:
            done = await (repair_by() if repair_by else _repair(client, keys, kind, job_id, *repair_args))
            repaired = done == 1
            if not repaired:
                return  # the condition no longer holds: a transition changed the job meanwhile
        findings.append(Finding(keys.queue, kind, job_id, detail, repaired))

    async def of_type(key_names: Sequence[str], expected: str, what: str = "holds") -> set[str]:
        """The keys of `key_names` that hold `expected` or nothing; each other one is reported (and deleted
        with --repair): the scripts read it as empty."""
        matching = set()
        for key, kind in zip(key_names, await _types(client, key_names), strict=True):
            if kind in ("none", expected):
                matching.add(key)
            else:
                await found(Kind.WRONG_TYPE, key, f"{what} a {kind}, not a {expected}", "", kind, expected)
        return matching

    # Keys that hold another type than jobcar writes there: reported (and deleted with --repair) first, and
    # read as empty, so that one such key never stops the check.
    set_types = _set_types(keys)
    held = dict(zip(set_types, await _types(client, [key for key, _ in set_types.values()]), strict=True))
    usable = set()
    for name, (key, expected) in set_types.items():
        if held[name] in ("none", expected):
            usable.add(name)
        else:
            await found(Kind.WRONG_TYPE, key, f"holds a {held[name]}, not a {expected}", "", held[name], expected)
    job_prefix = keys.job("")
    ids = [key[len(job_prefix) :] for key in await _scan(client, keys.all_jobs())]
    hashes, wrong = await _read_hashes(client, keys, ids)
    for job_id, kind in sorted(wrong.items()):
        await found(Kind.WRONG_TYPE, keys.job(job_id), f"job {job_id}'s key holds a {kind}, not a hash", job_id,
                    kind, "hash")  # fmt: skip
    pending, zsets = await _read_sets(client, keys, usable)

    sets: dict[str, list[str]] = {}
    pending_count: dict[str, int] = {}
    for job_id in pending:
        pending_count[job_id] = pending_count.get(job_id, 0) + 1
        if pending_count[job_id] == 1:
            sets.setdefault(job_id, []).append(State.PENDING.value)
    for name, members in zsets.items():
        for job_id, _ in members:
            sets.setdefault(job_id, []).append(name)
    # A held list may keep ids whose hash moved on (the lease drops them when it reaches them): only the
    # held hashes found in their group's list count as listed.
    groups = await _limit_groups(client, keys)
    await of_type([keys.held(group) for group in groups], "list")
    for job_id in await _held_ids(client, keys, groups):
        job = hashes.get(job_id)
        if job is not None and job.state == State.HELD.value and State.HELD.value not in sets.get(job_id, []):
            sets.setdefault(job_id, []).append(State.HELD.value)

    # Ids in the sets: several sets, no hash, duplicates in pending, a state that disagrees.
    for job_id in sorted(sets):
        where = sets[job_id]
        job = hashes.get(job_id)
        if job_id in wrong:
            continue  # reported above; the repair took the id out of every set
        if job is None:
            for name in where:
                await found(Kind.MISSING_HASH, job_id, f"in {name} without a job hash", name)
            continue
        if pending_count.get(job_id, 0) > 1:
            await found(Kind.DUPLICATE_PENDING, job_id, f"listed {pending_count[job_id]} times in the pending lists")
        if len(where) > 1:
            # No safe repair: which set is right is a guess (a lease may be running). Reported only.
            await found(
                Kind.SEVERAL_SETS,
                job_id,
                f"in {' and '.join(where)} (hash state {job.state or 'missing'})",
                fixable=False,
            )
            continue
        (name,) = where
        if job.state != name:
            await found(
                Kind.STATE_MISMATCH,
                job_id,
                f"in {name} but its hash says {job.state or 'nothing'}",
                name,
                job.state or "",
            )
        elif name == State.ACTIVE.value and not job.token:
            await found(Kind.ACTIVE_WITHOUT_LEASE, job_id, "active without a lease token")

    # Hashes in no set.
    runnable = {s.value for s in (*STORED_IN_SETS, State.HELD)}
    for job_id, job in sorted(hashes.items()):
        if job_id in sets:
            continue
        if job.state == State.ACTIVE.value:
            await found(Kind.ACTIVE_WITHOUT_LEASE, job_id, "active without a deadline in the active set")
        elif job.state in runnable:
            await found(Kind.ORPHAN_HASH, job_id, f"hash in state {job.state} is in no set", job.state or "")
        elif job.state in (State.DONE.value, State.CANCELED.value):
            if job.pttl == -1:
                await found(Kind.NO_TTL, job_id, f"{job.state} job without a TTL", REPAIR_TTL_MS)
        else:
            await found(Kind.BAD_STATE, job_id, f"hash in no set with state {job.state or 'missing'}", fixable=False)

    # Unique locks.
    locks = await _scan(client, keys.all_unique_locks())
    for chunk in _chunks(locks):
        pipe = client.pipeline(transaction=False)
        for lock in chunk:
            pipe.get(lock)
            pipe.pttl(lock)
        replies = await pipe.execute(raise_on_error=False)
        for i, lock in enumerate(chunk):
            if isinstance(replies[2 * i], ResponseError):
                (kind,) = await _types(client, [lock])
                await found(Kind.WRONG_TYPE, lock, f"unique lock holds a {kind}, not a string", "", kind, "string")
                replies[2 * i] = None
        holders = [None if replies[2 * i] is None else as_text(replies[2 * i]) for i in range(len(chunk))]
        live = {h for h in holders if h is not None}
        states = {h: j.state for h, j in hashes.items() if h in live}
        for i, lock in enumerate(chunk):
            holder, pttl = holders[i], int(replies[2 * i + 1])
            if holder is None:
                continue  # expired since the scan
            state = states.get(holder)
            if state not in (State.PENDING.value, State.SCHEDULED.value, State.ACTIVE.value):
                what = "a missing job" if state is None else f"a {state} job"
                await found(Kind.STALE_UNIQUE, lock, f"held by {what} {holder}", holder)
            elif pttl == -1:
                await found(Kind.UNIQUE_NO_TTL, lock, f"held by {holder} without a TTL", REPAIR_TTL_MS)

    # Unique windows and debounce keys outlive their jobs on purpose; each must be a string and expire.
    timed = await _scan(client, keys.all_windows()) + await _scan(client, keys.all_debounce_keys())
    for chunk in _chunks(timed):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
        for key, kind, pttl in zip(chunk, await _types(client, chunk), await pipe.execute(), strict=True):
            if kind not in ("none", "string"):
                await found(Kind.WRONG_TYPE, key, f"holds a {kind}, not a string", "", kind, "string")
            elif int(pttl) == -1:
                await found(Kind.UNIQUE_NO_TTL, key, "held without a TTL", REPAIR_TTL_MS)

    await _check_schedules(client, keys, "schedules" in usable, found)

    # Concurrency slots: each held for an active job (the reaper gives back the others too, ADR 0014). The
    # types whose groups are indexed: a rate group takes no slot, a key's turn group's type is indexed itself.
    slot_types = sorted({group.partition("#")[0] for group in groups if group[:1] not in ("@", "~")})
    slot_hashes = await of_type([keys.slots(job_type) for job_type in slot_types], "hash")
    for job_type in slot_types:
        if keys.slots(job_type) not in slot_hashes:
            continue
        for job_id in sorted(as_text(m) for m in await _hash_fields(client, keys.slots(job_type))):
            job = hashes.get(job_id)
            if job is None or job.state != State.ACTIVE.value:
                what = "has no job hash" if job is None else f"is {job.state or 'in no state'}"
                detail = f"holds a slot of type {job_type} but {what}"
                await found(Kind.LEAKED_SLOT, job_id, detail, job_type)

    # Batch counters: only their type can be wrong (a batch key of another type counts nothing).
    batches = await _scan(client, keys.all_batches())
    for chunk in _chunks(batches):
        await of_type(chunk, "hash", what="batch counters hold")

    now = await _redis_now_ms(client)
    await _check_waiting(client, keys, zsets[State.WAITING.value], now, dead_limits, found)

    # The dead set's bounds.
    dead = zsets[State.DEAD.value]
    over = len(dead) - dead_limits.max_jobs if dead_limits.max_jobs > 0 else 0
    old = sum(1 for _, died in dead if died < now - dead_limits.max_age_ms) if dead_limits.max_age_ms > 0 else 0
    if over > 0 or old > 0:
        detail = (
            f"{len(dead)} dead jobs ({max(over, 0)} over max_jobs {dead_limits.max_jobs}, "
            f"{old} older than {dead_limits.max_age_ms} ms)"
        )
        repaired = False
        if repair:
            args = ("", dead_limits.max_jobs, dead_limits.max_age_ms)
            trimmed = 0
            while (n := await _repair(client, keys, Kind.DEAD_OVER_LIMIT, *args)) > 0:
                trimmed += n
            repaired = True
            detail += f"; trimmed {trimmed}"
        findings.append(Finding(keys.queue, Kind.DEAD_OVER_LIMIT, "dead", detail, repaired))
    return findings
