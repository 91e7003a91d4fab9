"""What fsck reports: the kinds of finding, a finding, and a suspect (a finding before its repair)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from jobcar.scripts import Arg


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
    ORPHAN_HANDLER_DATA: Final = "orphan_handler_data"  # a job's log, steps or children without its job hash
    HANDLER_DATA_NO_TTL: Final = "handler_data_no_ttl"  # a job's log, steps or children that outlives its job
    BAD_SETTING: Final = "bad_setting"  # a field of a queue's settings that the enqueue script cannot use
    PENDING_COUNT: Final = "pending_count"  # a queue's pending counts by type that are not its pending and held jobs


@dataclass(frozen=True, slots=True)
class Finding:
    queue: str
    kind: str
    #: The job id; for unique-lock, handler-data and wrong_type findings the key; "dead" for the dead set's
    #: bounds, "pending_counts" for the queue's pending counts.
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


@dataclass(frozen=True, slots=True)
class Suspect:
    """What a check found, before any repair: the finding's id and detail, and what its repair takes after
    the id (a repair script's further ARGV)."""

    job_id: str
    detail: str
    args: tuple[Arg, ...] = ()
