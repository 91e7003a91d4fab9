"""Waiting jobs (ADR 0016): why a dependency will never tell a waiting job it ended, and the repair that
settles it as the producer would.

Each dependency a waiting job still waits for will tell it it ended: a job that has not ended and names it
among its dependents, an ending that waits in its queue's settled list, or a batch that has not fired. One
that will not (a producer that died between storing the job and registering it, keys deleted by hand, a
refused settle) is settled as the producer would: registered if it has not ended, else told how it ended,
a dependency that no longer exists counting as gone (failed).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Final

from redis.exceptions import ResponseError

from jobcar.dependencies import BATCH_REF_PREFIX
from jobcar.dependency_calls import DependOutcome, depend_call, settle_call
from jobcar.fsck.findings import Suspect
from jobcar.fsck.repairs import Target
from jobcar.keys import QueueKeys, job_ref, split_job_ref
from jobcar.replies import as_text
from jobcar.scripts import call
from jobcar.transport import AsyncRedis, execute_async

#: The states of a job that has not ended: it tells the jobs its dependents SET names when it does.
_RUNNING: Final = frozenset({"pending", "scheduled", "active", "held", "waiting"})


async def why_silent(client: AsyncRedis, keys: QueueKeys, job_id: str, ref: str) -> str | None:
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


async def settle_lost(target: Target, suspect: Suspect) -> Suspect | None:
    """What the producer does for a dependency enqueued earlier (the suspect's argument): register the
    waiting job with it, or tell the waiting job how it ended. None when an ending turned up meanwhile (the
    settler carries it) or the job no longer waits for it."""
    client, keys, job_id = target.client, target.keys, suspect.job_id
    ref = str(suspect.args[0])
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
            return suspect
    # An ending pushed since the check (the dependency ended just now) is the settler's to carry: read after
    # the dependency's state, it is there if the ending was.
    if dep_id in await _ending_ids(client, dep_keys):
        return None
    (told,) = await execute_async(client, [settle_call(keys, job_id, [ref], outcome, target.dead_limits, counts)])
    return None if as_text(told) == "ignored" else suspect


async def rebuild_waits(target: Target, suspect: Suspect) -> Suspect | None:
    """A waiting job's deps key of another type, or gone (its arguments the job id and the type held, "none"
    for gone): rebuilt from the job's `after` (`lua/repair/rebuild_deps.lua`), then each dependency that will
    not tell the job it ended is settled as `settle_lost` does, so that the job neither runs early nor waits
    for one that ended meanwhile. None when the key no longer held that type."""
    job_id, held = str(suspect.args[0]), str(suspect.args[1])
    keys, limits = target.keys, target.dead_limits
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.dead, keys.wake)
    args = (keys.prefix, job_id, held, limits.max_jobs, limits.max_age_ms)
    (reply,) = await execute_async(target.client, [call("repair/rebuild_deps", script_keys, args)])
    if not isinstance(reply, list):
        return None
    refs = [as_text(ref) for ref in reply]
    settled = 0
    for ref in refs:
        if await why_silent(target.client, keys, job_id, ref) is not None:
            settled += await settle_lost(target, Suspect(job_id, "", (ref,))) is not None
    if not refs:
        return replace(suspect, detail=f"{suspect.detail}; deleted (the job was not waiting or names no dependency)")
    return replace(suspect, detail=f"{suspect.detail}; rebuilt from its {len(refs)} reference(s), {settled} settled")


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
