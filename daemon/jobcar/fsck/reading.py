"""What fsck reads of one queue before it checks anything: a `Picture`, read with plain commands.

SCAN finds the job hashes and the keys that live apart from the state sets (unique locks, windows and
debounce keys, schedules, batch counters, the handler data beside a job); plain reads take the rest. Under
a running daemon the picture is not one instant: a job acked or leased between two reads may look
inconsistent for a moment, which is why every repair re-checks its condition first. A key that holds
another type than jobcar writes there is noted (`Mistyped`) and read as empty, as the scripts pass over
it, so that one such key never stops the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from redis.exceptions import ResponseError

from jobcar.fsck.apart_reads import (
    HandlerData,
    Lock,
    apart_keys,
    namespace_keys,
    read_handler_data,
    read_locks,
    read_mistyped_deps,
    read_schedules,
    read_slots,
    read_text_hash,
    read_windows,
)
from jobcar.fsck.plain_reads import Mistyped, chunks, mistyped_keys, redis_now_ms, scan, set_members
from jobcar.fsck.waiting import why_silent
from jobcar.job import State
from jobcar.keys import QueueKeys, all_starting
from jobcar.replies import as_text
from jobcar.transitions import DeadLetterLimits
from jobcar.transport import AsyncRedis

#: A waiting job younger than this is left alone: its producer may still be storing the jobs it waits for.
SETTLING_MS: Final = 60_000
#: The states of a listed job that the pending counts count (includes/count_pending.lua).
_COUNTED_STATES: Final = frozenset({State.PENDING.value, State.HELD.value})


@dataclass(frozen=True, slots=True)
class JobHash:
    state: str | None
    token: bool
    pttl: int
    #: Its `type` field, None when it has none.
    job_type: str | None = None


@dataclass(frozen=True, slots=True)
class Picture:
    """One queue as fsck read it, and the bounds its dead set is held to."""

    #: The queue's own keys (state sets and lists, settled, wake, schedules, limit groups, throttled, paused,
    #: settings, pending counts) that hold another type.
    mistyped_own: list[Mistyped]
    hashes: dict[str, JobHash]
    #: The job keys that hold another type than a hash, by id.
    mistyped_jobs: dict[str, Mistyped]
    #: The sets each id is in: pending once however often the lists hold it, held for a held hash in its
    #: group's list (a held list may keep ids whose hash moved on: the lease drops them when it reaches them).
    places: dict[str, list[str]]
    #: How many times the pending lists hold each id.
    pending_count: dict[str, int]
    #: The held lists that hold another type, of any group (indexed or not: the lease writes to both).
    mistyped_held: list[Mistyped]
    #: The unique locks (one that expired since the scan left out).
    locks: list[Lock]
    mistyped_locks: list[Mistyped]
    #: The unique windows and debounce keys, each with its PTTL.
    windows: dict[str, int]
    mistyped_windows: list[Mistyped]
    #: The schedules ZSET: each name with the tick it is indexed at.
    indexed: dict[str, int]
    #: Each schedule hash's next tick, None when it is paused or has none.
    next_ticks: dict[str, int | None]
    mistyped_schedules: list[Mistyped]
    #: The job ids holding a concurrency slot, by job type.
    slots: dict[str, list[str]]
    #: The slot hashes that hold another type, of any job type.
    mistyped_slots: list[Mistyped]
    mistyped_batches: list[Mistyped]
    #: The deps keys that hold another type, by the id of the job they belong to.
    mistyped_deps: dict[str, Mistyped]
    #: The queue's other keys of one per id, group or hour (dependents sets, waiters, history, alive keys,
    #: rate and turn keys, the jobs' handler data) that hold another type.
    mistyped_apart: list[Mistyped]
    #: The namespace's keys outside every queue (queues, daemons, layout, the schedule index) that hold
    #: another type.
    mistyped_namespace: list[Mistyped]
    #: The keys of the jobs' handler data that hold the type jobcar writes there (the others are in
    #: `mistyped_apart`).
    handler_data: list[HandlerData]
    #: The queue's settings hash, field by field (empty when it holds another type).
    settings: dict[str, str]
    #: The queue's pending counts as stored, type -> the field's text; None when the key holds another type
    #: (its own check reports it).
    pending_counts: dict[str, str] | None
    #: What they count: by job type ("" for none), the ids in a pending list or a held list of an indexed group
    #: (each once) whose hash is in state pending or held (lua/recount_pending.lua).
    pending_or_held: dict[str, int]
    #: Each waiting job old enough to check, with each dependency it waits for and why that one will never
    #: tell it it ended (None when it will).
    dependencies: dict[str, dict[str, str | None]]
    #: The dead set: each id with when it died.
    dead: list[tuple[str, float]]
    #: Redis's time (ms), which the ages of the waiting and the dead jobs are measured against.
    now: int
    #: Not read: the bounds the dead set is held to, from the config.
    dead_limits: DeadLetterLimits


async def read_queue(
    client: AsyncRedis, keys: QueueKeys, dead_limits: DeadLetterLimits, *, namespace: bool = True
) -> Picture:
    """Everything the checks look at, read before any of them runs (so before any repair); with `namespace`,
    the namespace's keys outside every queue too."""
    own = _own_keys(keys)
    mistyped_own = await mistyped_keys(client, dict(own.values()))
    usable = {name for name, (key, _) in own.items() if key not in {m.key for m in mistyped_own}}
    hashes, mistyped_jobs = await _read_hashes(client, keys)
    pending, zsets = await _read_sets(client, keys, own, usable)
    groups = sorted(as_text(m) for m in await set_members(client, keys.limit_groups))
    # Every held list and slot hash, not only those of indexed groups: the lease writes a job's group's
    # list before (or without) indexing it, and a slot hash of a type whose groups never filled counts.
    held_keys = {keys.held(group) for group in groups} | set(await scan(client, all_starting(keys.held(""))))
    mistyped_held = await mistyped_keys(client, dict.fromkeys(sorted(held_keys), "list"))
    held = await _held_ids(client, keys, groups)
    # Right after the lists: what the counts are compared with is read as near them in time as plain reads allow.
    pending_counts = await read_text_hash(client, keys.pending_counts) if "pending_counts" in usable else None
    places, pending_count = _places(pending, zsets, held, hashes)
    locks, mistyped_locks = await read_locks(client, keys)
    windows, mistyped_windows = await read_windows(client, keys)
    indexed, next_ticks, mistyped_schedules = await read_schedules(client, keys, "schedules" in usable)
    slots, mistyped_slots = await read_slots(client, keys, groups)
    mistyped_batches = await mistyped_keys(client, dict.fromkeys(await scan(client, keys.all_batches()), "hash"))
    mistyped_deps = await read_mistyped_deps(client, keys)
    handler_data, mistyped_handler_data = await read_handler_data(client, keys)
    mistyped_apart = await mistyped_keys(client, await apart_keys(client, keys)) + mistyped_handler_data
    mistyped_namespace = await mistyped_keys(client, namespace_keys(keys.namespace)) if namespace else []
    now = await redis_now_ms(client)
    return Picture(
        mistyped_own=mistyped_own,
        hashes=hashes,
        mistyped_jobs=mistyped_jobs,
        places=places,
        pending_count=pending_count,
        mistyped_held=mistyped_held,
        locks=locks,
        mistyped_locks=mistyped_locks,
        windows=windows,
        mistyped_windows=mistyped_windows,
        indexed=indexed,
        next_ticks=next_ticks,
        mistyped_schedules=mistyped_schedules,
        slots=slots,
        mistyped_slots=mistyped_slots,
        mistyped_batches=mistyped_batches,
        mistyped_deps=mistyped_deps,
        mistyped_apart=mistyped_apart,
        mistyped_namespace=mistyped_namespace,
        handler_data=handler_data,
        settings=await read_text_hash(client, keys.settings) if "settings" in usable else {},
        pending_counts=pending_counts,
        pending_or_held=_pending_or_held(pending, held, hashes),
        dependencies=await _read_dependencies(client, keys, zsets[State.WAITING.value], now, set(mistyped_deps)),
        dead=zsets[State.DEAD.value],
        now=now,
        dead_limits=dead_limits,
    )


# -- the state sets and the job hashes ------------------------------------------------------------


def _own_keys(keys: QueueKeys) -> dict[str, tuple[str, str]]:
    """The queue's own keys that fsck reads, by name, each with the type jobcar writes there."""
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
        "paused": (keys.paused, "string"),
        # Every enqueue into the queue reads it (its max_pending): of another type, each one fails.
        "settings": (keys.settings, "hash"),
        # The scripts pass over one of another type (includes/count_pending.lua), so its counts stay wrong: deleted,
        # it is recounted (the check `pending_counts`).
        "pending_counts": (keys.pending_counts, "hash"),
    }


def _pending_name(key: str, keys: QueueKeys) -> str:
    """`pending` for the default priority's list, `pending:<p>` for the others'."""
    return State.PENDING.value + key[len(keys.pending) :]


async def _read_hashes(client: AsyncRedis, keys: QueueKeys) -> tuple[dict[str, JobHash], dict[str, Mistyped]]:
    """The job hashes, and the job keys that hold another type, by id."""
    prefix = keys.job("")
    ids = [key[len(prefix) :] for key in await scan(client, keys.all_jobs())]
    hashes: dict[str, JobHash] = {}
    refused: list[str] = []
    for chunk in chunks(ids):
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["state", "token", "type"])
            pipe.pttl(keys.job(job_id))
        replies = await pipe.execute(raise_on_error=False)
        for i, job_id in enumerate(chunk):
            fields, pttl = replies[2 * i], replies[2 * i + 1]
            if isinstance(fields, ResponseError):
                refused.append(job_id)
                continue
            if int(pttl) == -2:
                continue  # gone since the scan
            state, token, job_type = (None if f is None else as_text(f) for f in fields)
            hashes[job_id] = JobHash(state, token is not None, int(pttl), job_type)
    mistyped = await mistyped_keys(client, {keys.job(job_id): "hash" for job_id in refused})
    return hashes, {m.key[len(prefix) :]: m for m in mistyped}


async def _read_sets(
    client: AsyncRedis, keys: QueueKeys, own: dict[str, tuple[str, str]], usable: set[str]
) -> tuple[list[str], dict[str, list[tuple[str, float]]]]:
    """The ids in the pending lists (every priority's, in lease order) and the sorted sets; a key not in
    `usable` (it holds another type) reads as empty."""
    pipe = client.pipeline(transaction=False)
    names = (State.SCHEDULED.value, State.ACTIVE.value, State.DEAD.value, State.WAITING.value)
    lists = [_pending_name(key, keys) for key in keys.pending_lists if _pending_name(key, keys) in usable]
    for name in lists:
        pipe.lrange(own[name][0], 0, -1)
    for name in names:
        if name in usable:
            pipe.zrange(own[name][0], 0, -1, withscores=True)
    replies = list(await pipe.execute())
    pending = [member for _ in lists for member in replies.pop(0)]
    zsets = {name: (replies.pop(0) if name in usable else []) for name in names}
    return [as_text(m) for m in pending], {
        name: [(as_text(m), float(s)) for m, s in members] for name, members in zsets.items()
    }


async def _held_ids(client: AsyncRedis, keys: QueueKeys, groups: list[str]) -> list[str]:
    """The ids in the held lists of `groups`; a list of another type reads as empty."""
    pipe = client.pipeline(transaction=False)
    for group in groups:
        pipe.lrange(keys.held(group), 0, -1)
    replies = await pipe.execute(raise_on_error=False)
    return [as_text(m) for reply in replies if not isinstance(reply, ResponseError) for m in reply]


def _places(
    pending: list[str], zsets: dict[str, list[tuple[str, float]]], held: list[str], hashes: dict[str, JobHash]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The sets each id is in, and how many times the pending lists hold it (see `Picture`)."""
    places: dict[str, list[str]] = {}
    pending_count: dict[str, int] = {}
    for job_id in pending:
        pending_count[job_id] = pending_count.get(job_id, 0) + 1
        if pending_count[job_id] == 1:
            places.setdefault(job_id, []).append(State.PENDING.value)
    for name, members in zsets.items():
        for job_id, _ in members:
            places.setdefault(job_id, []).append(name)
    for job_id in held:
        job = hashes.get(job_id)
        if job is not None and job.state == State.HELD.value and State.HELD.value not in places.get(job_id, []):
            places.setdefault(job_id, []).append(State.HELD.value)
    return places, pending_count


def _pending_or_held(pending: list[str], held: list[str], hashes: dict[str, JobHash]) -> dict[str, int]:
    """By job type, the jobs the pending counts count (see `Picture`)."""
    counts: dict[str, int] = {}
    for job_id in set(pending) | set(held):
        job = hashes.get(job_id)
        if job is not None and job.state in _COUNTED_STATES:
            counts[job.job_type or ""] = counts.get(job.job_type or "", 0) + 1
    return counts


async def _read_dependencies(
    client: AsyncRedis, keys: QueueKeys, waiting: list[tuple[str, float]], now: int, unreadable: set[str]
) -> dict[str, dict[str, str | None]]:
    """Each waiting job old enough to check, with why each of its dependencies will never tell it it ended.
    A job whose deps key is `unreadable` (another type) is left to that key's check."""
    dependencies: dict[str, dict[str, str | None]] = {}
    for job_id, created in waiting:
        if created <= now - SETTLING_MS and job_id not in unreadable:
            refs = sorted(as_text(m) for m in await set_members(client, keys.deps(job_id)))
            dependencies[job_id] = {ref: await why_silent(client, keys, job_id, ref) for ref in refs}
    return dependencies
