"""The repairs fsck runs with --repair, each after an atomic re-check of what it repairs.

Most are a Lua script, `lua/repair/<kind>.lua`, that first re-checks, against the current data, the very
condition it repairs, and does nothing when it no longer holds (a transition meanwhile fixed or replaced
it). A script is atomic in Redis: no daemon transition can run between its check and its writes, so a
repair never overwrites a newer state with one computed from a stale read. Repairs touch only keys of the
queue's hash tag, so each script stays in one Cluster slot.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

from jobcar.fsck.findings import Kind, Suspect
from jobcar.fsck.recount import recount_pending
from jobcar.keys import QueueKeys
from jobcar.replies import as_int
from jobcar.scripts import Arg, call
from jobcar.transitions import DeadLetterLimits
from jobcar.transport import AsyncRedis, execute_async

#: A repaired done/canceled hash without a TTL, or a unique lock without one (its unique_for is
#: unknown), expires after this long.
REPAIR_TTL_MS: Final = 86400 * 1000


@dataclass(frozen=True, slots=True)
class Target:
    """Where repairs write: one queue's keys, and the bounds its dead set is held to (a repair that ends a
    job trims it as every death does)."""

    client: AsyncRedis
    keys: QueueKeys
    dead_limits: DeadLetterLimits


#: A repair: the suspect as repaired (its detail may say how), or None when its condition was gone (a
#: passing view, not corruption: the finding is dropped).
Repair: TypeAlias = Callable[[Target, Suspect], Awaitable[Suspect | None]]


async def run_script(target: Target, kind: str, *args: Arg) -> int:
    """Run `lua/repair/<kind>.lua`: 1 (or a count) when it repaired, 0 when the condition was gone."""
    keys = target.keys
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.dead, keys.wake, keys.schedules)
    (reply,) = await execute_async(target.client, [call(f"repair/{kind}", script_keys, (keys.prefix, *args))])
    return as_int(reply)


async def _by_script(kind: str, target: Target, suspect: Suspect) -> Suspect | None:
    return suspect if await run_script(target, kind, suspect.job_id, *suspect.args) == 1 else None


def script(kind: str) -> Repair:
    """The repair `lua/repair/<kind>.lua`, given the suspect's id and its arguments."""
    return functools.partial(_by_script, kind)


async def delete_apart(target: Target, suspect: Suspect) -> Suspect | None:
    """A namespace key outside every queue's slot that holds another type (the suspect's key; its arguments
    the type held and the one expected): `lua/repair/wrong_type.lua` run on that key's own slot."""
    key, (_, held, expected) = suspect.job_id, suspect.args
    name = f"repair/{Kind.WRONG_TYPE}"
    (reply,) = await execute_async(target.client, [call(name, (key,), ("", key, "", held, expected))])
    return suspect if as_int(reply) == 1 else None


async def trim_dead(target: Target, suspect: Suspect) -> Suspect:
    """Trims the dead set to its bounds, in as many bounded calls as it takes; always a repair."""
    limits = target.dead_limits
    trimmed = 0
    while (n := await run_script(target, Kind.DEAD_OVER_LIMIT, "", limits.max_jobs, limits.max_age_ms)) > 0:
        trimmed += n
    return replace(suspect, detail=f"{suspect.detail}; trimmed {trimmed}")


async def confirm_count(target: Target, suspect: Suspect) -> Suspect | None:
    """A wrong count as the picture shows it, confirmed by the recount at one instant without writing (fsck's
    report: on a busy queue, lists, hashes and counts read apart almost always disagree for a moment); None
    when the counts are right. The detail stays the picture's: on a busy queue, its numbers are those of a moment
    near the recount's."""
    return suspect if (await recount_pending(target.client, target.keys, write=False)).changed else None


async def recount(target: Target, suspect: Suspect) -> Suspect | None:
    """Recounts the queue's pending counts (`lua/recount_pending.lua`), atomically: a count that a picture read
    while daemons ran made look wrong, but that was right when the recount ran, is left as it is (nothing changed:
    the finding is dropped)."""
    return suspect if (await recount_pending(target.client, target.keys)).changed else None
