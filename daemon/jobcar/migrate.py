"""Versioned key layouts (ADR 0019): which layout a namespace's keys are in, the daemon's check of it at start,
and `jobcar migrate`, which brings the keys of an earlier layout to this one (`keys.LAYOUT_VERSION`).

The version is in `<ns>:layout`. A daemon records the current one on a namespace that has none and holds no
keys of an earlier layout; producers neither read nor write it. Layout 1 is every namespace from before versions
were recorded: a limit slot was a member of a SET per group, `<prefix>running:<group>`, and a job's `slots` field
could be a JSON array. Layout 2 kept a type's slots in one hash, and no count of the pending jobs. Layout 3 keeps
each queue's `<prefix>pending_counts` (type -> jobs pending or held) in every script that moves a job into or
out of the pending and held lists: the producers' enqueue too, so a producer of an earlier version leaves its
jobs uncounted (`jobcar fsck --repair` recounts them).

The steps from an earlier layout: the slot SETs of layout 1 move into the slot hashes (`lua/migrate_slots.lua`),
then the pending counts of every queue that holds pending or held jobs, or counts of them, are recounted
(`lua/recount_pending.lua`): a daemon of layout 2 kept none, and did not count out the jobs it took that a
producer of this version had counted.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final

import redis.exceptions

from jobcar.fsck.recount import recount_pending
from jobcar.keys import (
    LAYOUT_VERSION,
    QueueKeys,
    all_earlier_slot_sets,
    all_pending_keys,
    earlier_slot_set,
    layout_key,
    queue_of_pending_key,
)
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import call
from jobcar.transport import AsyncRedis, execute_async

#: The layout of a namespace that records none but holds keys of an earlier layout.
LAYOUT_BEFORE_VERSIONS: Final = 1
SCAN_COUNT: Final = 1000


class LayoutError(Exception):
    """The namespace's keys are in a layout that this jobcar cannot run on or migrate; the message says why."""


@dataclass(frozen=True, slots=True)
class Migrated:
    """What `migrate` did: the layouts it went from and to, the slot SETs of layout 1 it emptied, the slots it
    moved from them into slot hashes, the `slots` fields it rewrote from JSON, and the queues whose pending
    counts it recounted."""

    from_version: int
    to_version: int
    slot_sets: int = 0
    slots_moved: int = 0
    fields_rewritten: int = 0
    queues_recounted: int = 0


async def recorded_layout(client: AsyncRedis, namespace: str) -> int | None:
    """The layout version the namespace records, or None when it records none."""
    raw = await client.get(layout_key(namespace))
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise LayoutError(
            f"{layout_key(namespace)} holds {raw!r}, not a key layout version: set it to the version the "
            "namespace's keys are in (docs/protocol.md)"
        ) from None


async def layout_refusal(client: AsyncRedis, namespace: str) -> str | None:
    """Why a daemon of this jobcar must not run on the namespace's keys, or None. A namespace that records no
    layout and holds no keys of an earlier one (a new namespace, or one whose daemons never held a limit slot)
    gets its pending counts recounted, then the current version recorded: its keys are then in this layout."""
    try:
        version = await recorded_layout(client, namespace)
    except LayoutError as exc:
        return str(exc)
    if version is None:
        earlier = await _first_earlier_slot_set(client, namespace)
        if earlier is None:
            # Jobs stored while no layout was recorded may be uncounted (producers of an earlier version): counted
            # before the version that says they are. A recount is atomic per queue, so producers may run meanwhile.
            try:
                await _recount_queues(client, namespace)
            except LayoutError as exc:
                return str(exc)
            if await client.set(layout_key(namespace), LAYOUT_VERSION, nx=True):
                return None
            return await layout_refusal(client, namespace)  # another process recorded a layout meanwhile
        return (
            f"namespace {namespace!r} records no key layout but holds keys of layout {LAYOUT_BEFORE_VERSIONS} "
            f"({earlier}), older than this jobcar's ({LAYOUT_VERSION}): {_how_to_migrate()}"
        )
    if version > LAYOUT_VERSION:
        return _newer(namespace, version)
    if version < LAYOUT_VERSION:
        return (
            f"namespace {namespace!r} has key layout {version}, older than this jobcar's ({LAYOUT_VERSION}): "
            f"{_how_to_migrate()}"
        )
    return None


async def migrate(client: AsyncRedis, namespace: str) -> Migrated:
    """Bring the namespace's keys to the current layout, then record it. Every step is one atomic script, and
    the version is recorded last: a run that stops part-way is finished by running it again, and a run on a
    namespace already at this layout changes nothing. Run it with no daemon of the namespace running."""
    version = await recorded_layout(client, namespace)
    if version is not None and version > LAYOUT_VERSION:
        raise LayoutError(_newer(namespace, version))
    if version == LAYOUT_VERSION:
        return Migrated(version, version)
    # Recorded before the first step: a daemon started while the steps run refuses instead of recording the
    # current layout on half-moved keys.
    await client.set(layout_key(namespace), LAYOUT_BEFORE_VERSIONS, nx=True)
    slot_sets = slots_moved = fields_rewritten = 0
    async for key, queue, group in _earlier_slot_sets(client, namespace):
        step = call("migrate_slots", [key], [QueueKeys.of(namespace, queue).prefix, group])
        try:
            (reply,) = await execute_async(client, [step])
        except redis.exceptions.ResponseError as exc:
            raise LayoutError(f"{key}: Redis refused to move its slots: {exc}") from None
        moved, rewritten = (as_int(n) for n in as_list(reply))
        slot_sets, slots_moved, fields_rewritten = slot_sets + 1, slots_moved + moved, fields_rewritten + rewritten
    # After the slots: a recount reads only the lists and the job hashes, which the slot step leaves as they were.
    recounted = await _recount_queues(client, namespace)
    await client.set(layout_key(namespace), LAYOUT_VERSION)
    return Migrated(
        version or LAYOUT_BEFORE_VERSIONS, LAYOUT_VERSION, slot_sets, slots_moved, fields_rewritten, recounted
    )


async def _recount_queues(client: AsyncRedis, namespace: str) -> int:
    """Recount the pending counts of every queue that may hold pending or held jobs: how many queues."""
    queues = await _queues_with_pending_keys(client, namespace)
    for queue in queues:
        keys = QueueKeys.of(namespace, queue)
        try:
            await recount_pending(client, keys)
        except redis.exceptions.ResponseError as exc:
            raise LayoutError(f"{keys.pending_counts}: Redis refused to recount it: {exc}") from None
    return len(queues)


def _how_to_migrate() -> str:
    return "stop every daemon of the namespace, run `jobcar migrate`, then start the daemons of this version"


def _newer(namespace: str, version: int) -> str:
    return (
        f"namespace {namespace!r} has key layout {version}, newer than this jobcar's ({LAYOUT_VERSION}): a newer "
        "jobcar wrote it, and a layout is never migrated back; run that version or a later one"
    )


async def _earlier_slot_sets(client: AsyncRedis, namespace: str) -> AsyncGenerator[tuple[str, str, str], None]:
    """(key, queue, group) of each slot SET of layout 1: one SCAN of the whole keyspace (every node of a
    Cluster)."""
    async for raw in client.scan_iter(match=all_earlier_slot_sets(namespace), count=SCAN_COUNT, _type="set"):
        key = as_text(raw)
        parts = earlier_slot_set(namespace, key)
        if parts is not None:
            yield key, *parts


async def _queues_with_pending_keys(client: AsyncRedis, namespace: str) -> list[str]:
    """The queues that have a pending list, pending counts or a held list, each once: one SCAN of the whole
    keyspace (every node of a Cluster). A queue whose counts only remain is among them: producers of this version
    counted jobs that daemons of layout 2 then leased without counting them out."""
    queues: set[str] = set()
    async for raw in client.scan_iter(match=all_pending_keys(namespace), count=SCAN_COUNT):
        queue = queue_of_pending_key(namespace, as_text(raw))
        if queue is not None:
            queues.add(queue)
    return sorted(queues)


async def _first_earlier_slot_set(client: AsyncRedis, namespace: str) -> str | None:
    async with aclosing(_earlier_slot_sets(client, namespace)) as found:
        async for key, _, _ in found:
            return key
    return None
