"""The checks fsck runs, in order: each a name, the kind of finding it makes, what finds it in the
queue as read (`Picture`), and the repair that fixes it (None when no repair is safe: reported only).

Each finder reads only the picture: all the I/O of a check is in the reading before and the repairs after.
Checks run, and repair, in the table's order, which is the report's. The job keys of another type come
before the ids in the sets: their repair takes the id out of every set, so the set checks pass over it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from jobcar.fsck.apart_reads import Lock
from jobcar.fsck.findings import Kind, Suspect
from jobcar.fsck.plain_reads import Mistyped
from jobcar.fsck.reading import JobHash, Picture
from jobcar.fsck.repairs import REPAIR_TTL_MS, Repair, confirm_count, delete_apart, recount, script, trim_dead
from jobcar.fsck.waiting import rebuild_waits, settle_lost
from jobcar.job import STORED_IN_SETS, State
from jobcar.queue_settings import MAX_PENDING_FIELD, REFUSED_FIELD, TYPE_BOUND_PREFIX

Finder = Callable[[Picture], Iterator[Suspect]]


@dataclass(frozen=True, slots=True)
class Check:
    """One row of the table: the name of the check, the kind of finding it makes, its finder, its repair."""

    name: str
    kind: str
    find: Finder
    #: None: no safe repair, so the finding is reported even with --repair.
    repair: Repair | None
    #: Without --repair, what re-checks a suspect atomically before it is reported (the suspect as reported, or
    #: None: a passing view); None: reported as found.
    confirm: Repair | None = None


# -- keys of another type -------------------------------------------------------------------------


def _of_another_type(mistyped: Callable[[Picture], list[Mistyped]], what: str = "holds") -> Finder:
    """Each key `mistyped` picks: the scripts read it as empty, and its repair deletes it."""

    def find(seen: Picture) -> Iterator[Suspect]:
        for key in mistyped(seen):
            yield Suspect(key.key, f"{what} a {key.holds}, not a {key.expected}", ("", key.holds, key.expected))

    return find


def _job_keys_of_another_type(seen: Picture) -> Iterator[Suspect]:
    """Its repair also takes the id out of every set, so that no script meets it again."""
    for job_id, key in sorted(seen.mistyped_jobs.items()):
        yield Suspect(key.key, f"job {job_id}'s key holds a {key.holds}, not a hash", (job_id, key.holds, "hash"))


def _deps_of_another_type(seen: Picture) -> Iterator[Suspect]:
    """Its repair rebuilds the set from the job's own record: nothing could tell the job to run meanwhile."""
    for job_id, key in sorted(seen.mistyped_deps.items()):
        detail = f"job {job_id}'s dependencies hold a {key.holds}, not a set"
        yield Suspect(key.key, detail, (job_id, key.holds))


# -- the ids in the state sets --------------------------------------------------------------------

_ACTIVE = State.ACTIVE.value


def _listed(seen: Picture) -> Iterator[tuple[str, list[str], JobHash | None]]:
    """Each id in a set, with the sets it is in and its hash (None: it has none). A mistyped job key's id
    is left out: its own check reports it, and its repair takes the id out of every set."""
    for job_id in sorted(seen.places):
        if job_id not in seen.mistyped_jobs:
            yield job_id, seen.places[job_id], seen.hashes.get(job_id)


def _in_one_set(seen: Picture) -> Iterator[tuple[str, str, JobHash]]:
    """Each id with a hash that is in exactly one set, with that set."""
    for job_id, where, job in _listed(seen):
        if job is not None and len(where) == 1:
            yield job_id, where[0], job


def _missing_hash(seen: Picture) -> Iterator[Suspect]:
    for job_id, where, job in _listed(seen):
        if job is None:
            for name in where:
                yield Suspect(job_id, f"in {name} without a job hash", (name,))


def _duplicate_pending(seen: Picture) -> Iterator[Suspect]:
    for job_id, _, job in _listed(seen):
        count = seen.pending_count.get(job_id, 0)
        if job is not None and count > 1:
            yield Suspect(job_id, f"listed {count} times in the pending lists")


def _several_sets(seen: Picture) -> Iterator[Suspect]:
    """No safe repair: which set is right is a guess (a lease may be running)."""
    for job_id, where, job in _listed(seen):
        if job is not None and len(where) > 1:
            yield Suspect(job_id, f"in {' and '.join(where)} (hash state {job.state or 'missing'})")


def _state_mismatch(seen: Picture) -> Iterator[Suspect]:
    for job_id, name, job in _in_one_set(seen):
        if job.state != name:
            yield Suspect(job_id, f"in {name} but its hash says {job.state or 'nothing'}", (name, job.state or ""))


def _active_without_token(seen: Picture) -> Iterator[Suspect]:
    for job_id, name, job in _in_one_set(seen):
        if name == job.state == _ACTIVE and not job.token:
            yield Suspect(job_id, "active without a lease token")


# -- the job hashes in no set ---------------------------------------------------------------------

#: The states of a job that some set lists while it has that state (active aside: its set holds its deadline).
_LISTED_STATES = frozenset(s.value for s in (*STORED_IN_SETS, State.HELD) if s is not State.ACTIVE)
#: The states of a finished job whose hash is kept a while (its result), in no set.
_FINISHED = frozenset({State.DONE.value, State.CANCELED.value})
_KNOWN_STATES = _LISTED_STATES | _FINISHED | {_ACTIVE}


def _unlisted(seen: Picture) -> Iterator[tuple[str, JobHash]]:
    for job_id, job in sorted(seen.hashes.items()):
        if job_id not in seen.places:
            yield job_id, job


def _active_without_deadline(seen: Picture) -> Iterator[Suspect]:
    for job_id, job in _unlisted(seen):
        if job.state == _ACTIVE:
            yield Suspect(job_id, "active without a deadline in the active set")


def _orphan_hash(seen: Picture) -> Iterator[Suspect]:
    for job_id, job in _unlisted(seen):
        if job.state is not None and job.state in _LISTED_STATES:
            yield Suspect(job_id, f"hash in state {job.state} is in no set", (job.state,))


def _no_ttl(seen: Picture) -> Iterator[Suspect]:
    for job_id, job in _unlisted(seen):
        if job.state in _FINISHED and job.pttl == -1:
            yield Suspect(job_id, f"{job.state} job without a TTL", (REPAIR_TTL_MS,))


def _bad_state(seen: Picture) -> Iterator[Suspect]:
    """No safe repair: which set it belongs in is a guess."""
    for job_id, job in _unlisted(seen):
        if job.state not in _KNOWN_STATES:
            yield Suspect(job_id, f"hash in no set with state {job.state or 'missing'}")


# -- unique locks, windows and debounce keys ------------------------------------------------------

#: The states of a job that may hold a unique lock: one that has not run to its end.
_LOCKING_STATES = frozenset({State.PENDING.value, State.SCHEDULED.value, _ACTIVE})


def _holder_state(seen: Picture, lock: Lock) -> str | None:
    job = seen.hashes.get(lock.holder)
    return None if job is None else job.state


def _stale_unique(seen: Picture) -> Iterator[Suspect]:
    for lock in seen.locks:
        state = _holder_state(seen, lock)
        if state not in _LOCKING_STATES:
            what = "a missing job" if state is None else f"a {state} job"
            yield Suspect(lock.key, f"held by {what} {lock.holder}", (lock.holder,))


def _unique_no_ttl(seen: Picture) -> Iterator[Suspect]:
    for lock in seen.locks:
        if _holder_state(seen, lock) in _LOCKING_STATES and lock.pttl == -1:
            yield Suspect(lock.key, f"held by {lock.holder} without a TTL", (REPAIR_TTL_MS,))


def _window_no_ttl(seen: Picture) -> Iterator[Suspect]:
    """Windows and debounce keys outlive their jobs on purpose, so each must expire."""
    for key, pttl in seen.windows.items():
        if pttl == -1:
            yield Suspect(key, "held without a TTL", (REPAIR_TTL_MS,))


# -- schedules, slots, waiting jobs, the dead set -------------------------------------------------


def _schedule_missing(seen: Picture) -> Iterator[Suspect]:
    for name, score in sorted(seen.indexed.items()):
        if name not in seen.next_ticks:
            yield Suspect(name, "in the schedules ZSET without a schedule hash", (score,))


def _schedule_unindexed(seen: Picture) -> Iterator[Suspect]:
    """A schedule neither paused nor finished must be in the ZSET at its next tick, else no daemon fires it."""
    for name, next_tick in sorted(seen.next_ticks.items()):
        if next_tick is not None and seen.indexed.get(name) != next_tick:
            detail = f"waits at tick {next_tick} but the ZSET says {seen.indexed.get(name, 'nothing')}"
            yield Suspect(name, f"{detail}: no daemon would fire it then", (next_tick,))


def _leaked_slot(seen: Picture) -> Iterator[Suspect]:
    """Each slot is held for an active job (the reaper gives back the others too, ADR 0014)."""
    for job_type, holders in seen.slots.items():
        for job_id in holders:
            job = seen.hashes.get(job_id)
            if job is None or job.state != _ACTIVE:
                what = "has no job hash" if job is None else f"is {job.state or 'in no state'}"
                yield Suspect(job_id, f"holds a slot of type {job_type} but {what}", (job_type,))


def _waiting_for_nothing(seen: Picture) -> Iterator[Suspect]:
    """Its repair rebuilds what it waits for from its own `after`, and settles those that ended: the set was
    emptied by something else, so what the job names may not have run yet (it must never run early)."""
    for job_id, dependencies in seen.dependencies.items():
        if not dependencies:
            yield Suspect(job_id, "waiting, with no dependency left to wait for", (job_id, "none"))


def _lost_dependency(seen: Picture) -> Iterator[Suspect]:
    for job_id, dependencies in seen.dependencies.items():
        for ref, why in dependencies.items():
            if why is not None:
                yield Suspect(job_id, f"waits for {ref}, {why}", (ref,))


def _orphan_handler_data(seen: Picture) -> Iterator[Suspect]:
    """A job's log, steps or children left behind by its hash (every script that deletes a job deletes
    them, includes/handler_data.lua): nothing reads them any more."""
    for data in seen.handler_data:
        if data.job_pttl == -2:
            yield Suspect(data.key, f"handler data of job {data.job_id}, which has no hash", (data.job_id,))


def _handler_data_no_ttl(seen: Picture) -> Iterator[Suspect]:
    """A kept job's handler data expires with it (ack gives both the same TTL): its repair gives the key the
    job's PTTL."""
    for data in seen.handler_data:
        if data.pttl == -1 and data.job_pttl > 0:
            detail = f"handler data of job {data.job_id} without a TTL, while its job expires"
            yield Suspect(data.key, detail, (data.job_id,))


#: A whole number of at least 1: a bound as the daemons write it, a count of jobs as the scripts keep it.
_AT_LEAST_ONE: Final = re.compile(r"[1-9][0-9]*").fullmatch
#: What the enqueue script needs of each field of a queue's settings (lua/includes/max_pending.lua): the daemons
#: write a bound as a whole number of at least 1, and the refusals are counted with HINCRBY, which fails on
#: anything but a whole number (the full queue's refusal would then be a bare error).
_SETTINGS: Final = {
    MAX_PENDING_FIELD: (_AT_LEAST_ONE, "a whole number of at least 1"),
    REFUSED_FIELD: (re.compile(r"0|[1-9][0-9]*").fullmatch, "a count"),
}


def _bad_setting(seen: Picture) -> Iterator[Suspect]:
    """Its repair deletes the field: a bound the daemons serving the queue write again at their next start or
    reload (none meanwhile), a count that starts again from 0. A type's bound, `max_pending:<type>`, is checked
    as the queue's is."""
    for name, value in sorted(seen.settings.items()):
        rule = _SETTINGS.get(MAX_PENDING_FIELD if name.startswith(TYPE_BOUND_PREFIX) else name)
        if rule is not None and not rule[0](value):
            yield Suspect(name, f"the queue's setting {name} is {value[:40]!r}, not {rule[1]}", (value,))


#: The id of a pending_count finding: one per queue, since its repair recounts every type at once.
PENDING_COUNTS: Final = "pending_counts"
#: At most this many types are named in its detail, the wrong counts of the others only counted.
_TYPES_SHOWN: Final = 10


def _counted(value: str | None) -> str:
    if value is None:
        return "not counted"
    return f"counted {value if _AT_LEAST_ONE(value) else repr(value[:40])}"


def _pending_counts(seen: Picture) -> Iterator[Suspect]:
    """The stored count of each type against the jobs the picture shows pending or held. One finding for the
    queue, naming each type that differs: its repair (`repairs.recount`) recounts them all in one atomic call,
    which a picture read while daemons ran needs (lists, hashes and counts read apart may disagree for a
    moment). Counts of another type are left to their own check, which deletes them: the next round recounts."""
    stored = seen.pending_counts
    if stored is None:
        return
    wrong: list[str] = []
    for job_type in sorted(stored.keys() | seen.pending_or_held.keys()):
        value, jobs = stored.get(job_type), seen.pending_or_held.get(job_type, 0)
        if value != (str(jobs) if jobs else None):
            what = f"type {job_type}" if job_type else "jobs without a type"
            wrong.append(f"{what}: {_counted(value)}, {jobs} pending or held")
    if wrong:
        more = f"; and {len(wrong) - _TYPES_SHOWN} types more" if len(wrong) > _TYPES_SHOWN else ""
        yield Suspect(PENDING_COUNTS, "; ".join(wrong[:_TYPES_SHOWN]) + more)


def _dead_over_limit(seen: Picture) -> Iterator[Suspect]:
    limits, dead = seen.dead_limits, seen.dead
    over = len(dead) - limits.max_jobs if limits.max_jobs > 0 else 0
    old = sum(1 for _, died in dead if died < seen.now - limits.max_age_ms) if limits.max_age_ms > 0 else 0
    if over > 0 or old > 0:
        yield Suspect(
            "dead",
            f"{len(dead)} dead jobs ({max(over, 0)} over max_jobs {limits.max_jobs}, "
            f"{old} older than {limits.max_age_ms} ms)",
        )


_WRONG_TYPE = script(Kind.WRONG_TYPE)

#: Every check, in the order they run.
CHECKS: Final = (
    Check("mistyped_own_keys", Kind.WRONG_TYPE, _of_another_type(lambda seen: seen.mistyped_own), _WRONG_TYPE),
    Check("mistyped_job_keys", Kind.WRONG_TYPE, _job_keys_of_another_type, _WRONG_TYPE),
    Check("mistyped_held_lists", Kind.WRONG_TYPE, _of_another_type(lambda seen: seen.mistyped_held), _WRONG_TYPE),
    Check("missing_hash", Kind.MISSING_HASH, _missing_hash, script(Kind.MISSING_HASH)),
    Check("duplicate_pending", Kind.DUPLICATE_PENDING, _duplicate_pending, script(Kind.DUPLICATE_PENDING)),
    Check("several_sets", Kind.SEVERAL_SETS, _several_sets, None),
    Check("state_mismatch", Kind.STATE_MISMATCH, _state_mismatch, script(Kind.STATE_MISMATCH)),
    Check("active_without_token", Kind.ACTIVE_WITHOUT_LEASE, _active_without_token, script(Kind.ACTIVE_WITHOUT_LEASE)),
    Check(
        "active_without_deadline",
        Kind.ACTIVE_WITHOUT_LEASE,
        _active_without_deadline,
        script(Kind.ACTIVE_WITHOUT_LEASE),
    ),
    Check("orphan_hash", Kind.ORPHAN_HASH, _orphan_hash, script(Kind.ORPHAN_HASH)),
    Check("no_ttl", Kind.NO_TTL, _no_ttl, script(Kind.NO_TTL)),
    Check("bad_state", Kind.BAD_STATE, _bad_state, None),
    Check(
        "mistyped_unique_locks",
        Kind.WRONG_TYPE,
        _of_another_type(lambda seen: seen.mistyped_locks, "unique lock holds"),
        _WRONG_TYPE,
    ),
    Check("stale_unique", Kind.STALE_UNIQUE, _stale_unique, script(Kind.STALE_UNIQUE)),
    Check("unique_no_ttl", Kind.UNIQUE_NO_TTL, _unique_no_ttl, script(Kind.UNIQUE_NO_TTL)),
    Check("mistyped_windows", Kind.WRONG_TYPE, _of_another_type(lambda seen: seen.mistyped_windows), _WRONG_TYPE),
    Check("window_no_ttl", Kind.UNIQUE_NO_TTL, _window_no_ttl, script(Kind.UNIQUE_NO_TTL)),
    Check(
        "mistyped_schedules",
        Kind.WRONG_TYPE,
        _of_another_type(lambda seen: seen.mistyped_schedules, "schedule holds"),
        _WRONG_TYPE,
    ),
    Check("schedule_missing", Kind.SCHEDULE_MISSING, _schedule_missing, script(Kind.SCHEDULE_MISSING)),
    Check("schedule_unindexed", Kind.SCHEDULE_UNINDEXED, _schedule_unindexed, script(Kind.SCHEDULE_UNINDEXED)),
    Check("mistyped_slot_hashes", Kind.WRONG_TYPE, _of_another_type(lambda seen: seen.mistyped_slots), _WRONG_TYPE),
    Check("leaked_slot", Kind.LEAKED_SLOT, _leaked_slot, script(Kind.LEAKED_SLOT)),
    Check(
        "mistyped_batch_counters",
        Kind.WRONG_TYPE,
        _of_another_type(lambda seen: seen.mistyped_batches, "batch counters hold"),
        _WRONG_TYPE,
    ),
    Check("mistyped_other_keys", Kind.WRONG_TYPE, _of_another_type(lambda seen: seen.mistyped_apart), _WRONG_TYPE),
    Check("orphan_handler_data", Kind.ORPHAN_HANDLER_DATA, _orphan_handler_data, script(Kind.ORPHAN_HANDLER_DATA)),
    Check("handler_data_no_ttl", Kind.HANDLER_DATA_NO_TTL, _handler_data_no_ttl, script(Kind.HANDLER_DATA_NO_TTL)),
    Check(
        "mistyped_namespace_keys",
        Kind.WRONG_TYPE,
        _of_another_type(lambda seen: seen.mistyped_namespace),
        delete_apart,
    ),
    Check("mistyped_deps_sets", Kind.WRONG_TYPE, _deps_of_another_type, rebuild_waits),
    Check("waiting_for_nothing", Kind.WAITING_FOR_NOTHING, _waiting_for_nothing, rebuild_waits),
    Check("lost_dependency", Kind.LOST_DEPENDENCY, _lost_dependency, settle_lost),
    Check("bad_settings", Kind.BAD_SETTING, _bad_setting, script(Kind.BAD_SETTING)),
    # After every repair that moves jobs into or out of the pending and held lists: the recount counts what they
    # left.
    Check("pending_counts", Kind.PENDING_COUNT, _pending_counts, recount, confirm_count),
    Check("dead_over_limit", Kind.DEAD_OVER_LIMIT, _dead_over_limit, trim_dead),
)
