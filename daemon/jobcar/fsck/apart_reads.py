"""fsck's reads of a queue's keys that live apart from its state sets and job hashes: unique locks, windows and
debounce keys, schedules, limit slots, deps sets, handler data, settings, and the namespace's own keys. Each
is found by SCAN or named by the queue's keys, read with plain commands, and a key of another type than
jobcar writes there is noted (`Mistyped`) and read as empty (`reading.py` puts them in the `Picture`)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import ResponseError

from jobcar.fsck.plain_reads import Mistyped, chunks, hash_fields, mistyped_keys, scan
from jobcar.keys import QueueKeys, all_starting, daemons_key, layout_key, queues_key
from jobcar.limit_groups import GroupKind, parse_group
from jobcar.replies import as_text
from jobcar.schedules import index_key
from jobcar.transport import AsyncRedis


@dataclass(frozen=True, slots=True)
class Lock:
    """A unique lock: the job holding it, and its PTTL (-1: it never expires)."""

    key: str
    holder: str
    pttl: int


@dataclass(frozen=True, slots=True)
class HandlerData:
    """A key of what a job's handlers wrote beside its hash (its log, steps or children: `QueueKeys.log`,
    `steps`, `children`), with its PTTL and its job hash's, read one after the other (-2: none; -1: it never
    expires)."""

    key: str
    job_id: str
    pttl: int
    job_pttl: int


async def read_locks(client: AsyncRedis, keys: QueueKeys) -> tuple[list[Lock], list[Mistyped]]:
    """The unique locks, each with the job holding it, and those that are not a string."""
    locks: list[Lock] = []
    refused: list[str] = []
    for chunk in chunks(await scan(client, keys.all_unique_locks())):
        pipe = client.pipeline(transaction=False)
        for lock in chunk:
            pipe.get(lock)
            pipe.pttl(lock)
        replies = await pipe.execute(raise_on_error=False)
        for i, lock in enumerate(chunk):
            holder, pttl = replies[2 * i], replies[2 * i + 1]
            if isinstance(holder, ResponseError):
                refused.append(lock)
            elif holder is not None:  # else expired since the scan
                locks.append(Lock(lock, as_text(holder), int(pttl)))
    return locks, await mistyped_keys(client, dict.fromkeys(refused, "string"))


async def read_windows(client: AsyncRedis, keys: QueueKeys) -> tuple[dict[str, int], list[Mistyped]]:
    """Unique windows and debounce keys outlive their jobs on purpose: each is a string that must expire."""
    timed = await scan(client, keys.all_windows()) + await scan(client, keys.all_debounce_keys())
    mistyped = await mistyped_keys(client, dict.fromkeys(timed, "string"))
    strings = [key for key in timed if key not in {m.key for m in mistyped}]
    windows: dict[str, int] = {}
    for chunk in chunks(strings):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
        windows.update(zip(chunk, (int(pttl) for pttl in await pipe.execute()), strict=True))
    return windows, mistyped


async def read_schedules(
    client: AsyncRedis, keys: QueueKeys, zset_usable: bool
) -> tuple[dict[str, int], dict[str, int | None], list[Mistyped]]:
    """The schedules ZSET, and each schedule hash's next tick (None when paused or without one)."""
    indexed: dict[str, int] = {}
    if zset_usable:
        read = client.pipeline(transaction=False)
        read.zrange(keys.schedules, 0, -1, withscores=True)
        (members,) = await read.execute()
        indexed = {as_text(member): int(score) for member, score in members}
    prefix = keys.schedule("")
    names = [key[len(prefix) :] for key in await scan(client, keys.all_schedules())]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(keys.schedule(name), "next", "paused")
    next_ticks: dict[str, int | None] = {}
    refused: list[str] = []
    for name, reply in zip(names, await pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, ResponseError):
            refused.append(keys.schedule(name))
            continue
        waits_at, paused = (None if v is None else as_text(v) for v in reply)
        next_ticks[name] = int(waits_at) if waits_at and paused != "1" else None
    return indexed, next_ticks, await mistyped_keys(client, dict.fromkeys(refused, "hash"))


async def read_slots(
    client: AsyncRedis, keys: QueueKeys, groups: list[str]
) -> tuple[dict[str, list[str]], list[Mistyped]]:
    """The ids holding each type's slots. The types whose groups are indexed: a rate group takes no slot, a
    key's turn group's type is indexed itself."""
    names = [parse_group(group) for group in groups]
    slot_types = sorted({name.job_type for name in names if name.kind is GroupKind.CONCURRENCY})
    slot_keys = {keys.slots(job_type) for job_type in slot_types} | set(
        await scan(client, all_starting(keys.slots("")))
    )
    mistyped = await mistyped_keys(client, dict.fromkeys(sorted(slot_keys), "hash"))
    slots: dict[str, list[str]] = {}
    for job_type in slot_types:
        if keys.slots(job_type) not in {m.key for m in mistyped}:
            slots[job_type] = sorted(as_text(m) for m in await hash_fields(client, keys.slots(job_type)))
    return slots, mistyped


async def read_mistyped_deps(client: AsyncRedis, keys: QueueKeys) -> dict[str, Mistyped]:
    """The deps keys that hold another type than a SET, by their job's id: whatever waits there cannot be
    read, so the job is not `waiting_for_nothing` (its own check rebuilds what it waits for)."""
    prefix = keys.deps("")
    found = await mistyped_keys(client, dict.fromkeys(await scan(client, all_starting(prefix)), "set"))
    return {m.key[len(prefix) :]: m for m in found}


async def apart_keys(client: AsyncRedis, keys: QueueKeys) -> dict[str, str]:
    """The queue's keys of one per id, group or hour that no other check reads, with the type each holds."""
    kinds = (
        (keys.dependents(""), "set"),
        (keys.waiter(""), "string"),
        (keys.history + ":", "hash"),
        (keys.alive(""), "string"),
        (keys.tat(""), "string"),
        (keys.turns(""), "zset"),
    )
    expected: dict[str, str] = {}
    for start, holds in kinds:
        expected.update(dict.fromkeys(await scan(client, all_starting(start)), holds))
    return expected


async def read_text_hash(client: AsyncRedis, key: str) -> dict[str, str]:
    """A small hash of the queue's own (its settings, its pending counts), field by field as text."""
    return {as_text(field): as_text(value) for field, value in (await client.hgetall(key)).items()}


async def read_handler_data(client: AsyncRedis, keys: QueueKeys) -> tuple[list[HandlerData], list[Mistyped]]:
    """Every key of the jobs' handler data, with its PTTL and its job hash's, and those of another type. A key
    and its job are read one right after the other, so that a job acked meanwhile is seen with its data (both
    gone, or both there) rather than one without the other, as a hash read by the earlier SCAN would."""
    kinds = ((keys.log(""), "list"), (keys.steps(""), "hash"), (keys.children(""), "zset"))
    expected: dict[str, str] = {}
    job_ids: dict[str, str] = {}
    for start, holds in kinds:
        for key in await scan(client, all_starting(start)):
            expected[key], job_ids[key] = holds, key[len(start) :]
    mistyped = await mistyped_keys(client, expected)
    wrong = {m.key for m in mistyped}
    found: list[HandlerData] = []
    for chunk in chunks([key for key in expected if key not in wrong]):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
            pipe.pttl(keys.job(job_ids[key]))
        replies = await pipe.execute()
        for i, key in enumerate(chunk):
            pttl, job_pttl = int(replies[2 * i]), int(replies[2 * i + 1])
            if pttl != -2:  # else gone since the scan
                found.append(HandlerData(key, job_ids[key], pttl, job_pttl))
    return found, mistyped


def namespace_keys(namespace: str) -> dict[str, str]:
    """The namespace's keys outside every queue, with the type each holds."""
    return {queues_key(namespace): "set", daemons_key(namespace): "hash", layout_key(namespace): "string",
            index_key(namespace): "hash"}  # fmt: skip
