"""The job as the rest of jobcar sees it: its states, its stored fields and what enqueue returns.

Only the standard library is imported here: the producer client (and a Spark executor that gets
jobcar as a zip) depends on this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

DEFAULT_CONTENT_TYPE: Final = "application/json"


class State(StrEnum):
    """Where a job is. The values are the strings stored in the job hash and returned by the Lua scripts."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    ACTIVE = "active"
    DEAD = "dead"
    DONE = "done"  # only seen while a finished job's result is retained
    CANCELED = "canceled"  # only seen in replies: a canceled job is deleted
    HELD = "held"  # over a concurrency limit: waits in its limit group's list until a slot is free
    WAITING = "waiting"  # for the jobs it runs after (`after`): pending once they are all done


#: The most references of `after` a handler gets with the job (a chain's step has one).
MAX_AFTER_IN_HEADER: Final = 16

#: States a job ends in while its hash is kept: a waiter stops at these (a job that succeeds without a kept
#: result, or is canceled, is deleted instead).
FINISHED: Final = frozenset({State.DONE, State.DEAD})
#: The sets that hold job ids in Redis; every stored job id is in exactly one of them.
STORED_IN_SETS: Final = (State.PENDING, State.SCHEDULED, State.ACTIVE, State.DEAD, State.WAITING)


class EnqueueStatus(StrEnum):
    """What an enqueue did."""

    CREATED = "created"  # a new job was stored
    EXISTS = "exists"  # a job with the caller-chosen id already exists; nothing was written
    DUPLICATE = "duplicate"  # the unique key is held by another job; nothing was written
    DEBOUNCED = "debounced"  # the debounce key's waiting job took the payload and runs later; no new job


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The answer to an enqueue: the job's id and state (for EXISTS and DUPLICATE, the existing job's)."""

    id: str
    queue: str
    state: State
    status: EnqueueStatus

    @property
    def created(self) -> bool:
        return self.status is EnqueueStatus.CREATED


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One entry of a job's error history: what went wrong in which attempt, at Redis time (ms)."""

    attempt: int
    at_ms: int
    error: str


def parse_errors(raw: bytes | None) -> tuple[AttemptError, ...]:
    if not raw:
        return ()
    entries = json.loads(raw.decode("utf-8", "replace"))
    # Lua's cjson encodes an empty table as an object, never as [].
    if not isinstance(entries, list):
        return ()
    return tuple(AttemptError(int(e["attempt"]), int(e["at"]), str(e["error"])) for e in entries)


@dataclass(frozen=True, slots=True)
class Progress:
    """The latest progress a job's handler reported through the handler API (the hash's `progress` field): a
    percentage and/or a short message, when (ms, the daemon's clock) and in which attempt."""

    at_ms: int
    attempt: int
    percent: float | None = None
    message: str | None = None


def parse_progress(raw: bytes | None) -> Progress | None:
    """The `progress` field; a field that is not the documented JSON object (written by hand) reads as none."""
    if not raw:
        return None
    try:
        document = json.loads(raw)
        if not isinstance(document, dict):
            return None
        percent, message = document.get("percent"), document.get("message")
        return Progress(
            int(document["at"]),
            int(document["attempt"]),
            float(percent) if isinstance(percent, (int, float)) and not isinstance(percent, bool) else None,
            message if isinstance(message, str) else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def _ms_to_datetime(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, tz=UTC)


@dataclass(slots=True)
class Job:
    """A job as stored in its hash (see docs/protocol.md for the fields): a snapshot, which nothing in
    jobcar changes after building it.

    Not a frozen dataclass, unlike the small records around it: the daemon builds one per leased job,
    and a frozen one sets each of its 30 fields through `object.__setattr__`, three times the cost
    (ADR 0006)."""

    id: str
    queue: str
    type: str
    payload: bytes
    state: State
    content_type: str = DEFAULT_CONTENT_TYPE
    attempt: int = 0
    max_attempts: int | None = None
    timeout_ms: int | None = None
    #: The producer's first retry delay (`backoff=`), in place of its handler's backoff base.
    backoff_ms: int | None = None
    created_ms: int = 0
    run_at_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    token: str | None = None
    errors: tuple[AttemptError, ...] = ()
    unique_key: str | None = None
    #: The unique key is held for its whole `unique_for`, not only until the job ends.
    unique_window: bool = False
    traceparent: str | None = None
    meta: dict[str, str] = field(default_factory=dict)
    batch: str | None = None
    result: bytes | None = None
    #: Why a finished job's result was not kept (Redis was out of memory when it finished), or None.
    result_dropped: str | None = None
    cancel_requested: bool = False
    #: 0 (the default, first) to 9 (last): pending jobs of a queue run in priority order, FIFO within one.
    priority: int = 0
    #: A job not started by then (ms, Redis time) is never run: it dies with the reason `expired`.
    expires_at_ms: int | None = None
    #: The producer's window (`keep_for=`): the job's id and result are kept this long after it ends.
    keep_for_ms: int | None = None
    #: The debounce key whose enqueues go into this job while it waits.
    debounce_key: str | None = None
    #: The schedule that fired this job and the tick it fired for (ms), for a periodic job.
    schedule: str | None = None
    scheduled_at_ms: int | None = None
    #: The producer's key for its type's per-key limits (`key=`).
    limit_key: str | None = None
    #: While held: the limit group it waits for ("<type>" or "<type>#<key>").
    held_for: str | None = None
    #: When a limit first held the job (ms, Redis time), until it is leased: in a lease's reply, how long
    #: limits held it.
    held_at_ms: int | None = None
    #: The jobs it was enqueued to wait for, as references "<queue>/<id>" (ADR 0016), and what a failed one
    #: does to it (None: the default, "fail").
    after: tuple[str, ...] = ()
    on_dependency_failure: str | None = None
    #: The latest progress its handler reported (the handler API), or None.
    progress: Progress | None = None
    #: The job whose handler made it, as a reference "<queue>/<id>" (a child job), or None.
    parent: str | None = None

    @property
    def after_header(self) -> str | None:
        """What the job waits for, as handlers get it (`Jobcar-After`, `JOBCAR_AFTER`): the references
        separated by spaces, which neither queue names nor ids hold. None for a job that waits for nothing
        or for more than MAX_AFTER_IN_HEADER jobs (a fan-in: its handler reads its job document instead)."""
        if not self.after or len(self.after) > MAX_AFTER_IN_HEADER:
            return None
        return " ".join(self.after)

    @property
    def last_error(self) -> str | None:
        return self.errors[-1].error if self.errors else None

    @property
    def created_at(self) -> datetime:
        return datetime.fromtimestamp(self.created_ms / 1000, tz=UTC)

    @property
    def run_at(self) -> datetime | None:
        return _ms_to_datetime(self.run_at_ms)

    @property
    def ready_ms(self) -> int:
        """When the job became runnable: its run-at if it was delayed, else its enqueue time."""
        return self.run_at_ms if self.run_at_ms is not None else self.created_ms

    @classmethod
    def from_hash(cls, job_id: str, queue: str, fields: dict[bytes, bytes]) -> Job:
        """Build a Job from an HGETALL reply (bytes keys and values). On the daemon's hot path (every
        leased job): it reads the fields the hash holds (a leased job's seven or eight), each through the
        table, rather than looking up every field a job may have; a field it lacks keeps its default."""
        values: dict[str, Any] = {}
        for name, raw in fields.items():
            known = _FIELDS.get(name)
            if known is not None:
                values[known[0]] = known[1](raw)
        if not values.get("content_type", DEFAULT_CONTENT_TYPE):
            values["content_type"] = DEFAULT_CONTENT_TYPE
        if "held_for" in values and values.get("state") is not State.HELD:
            del values["held_for"]
        if b"unique_window" in fields:
            values["unique_window"] = True
            if not fields.get(b"unique"):
                values["unique_key"] = _text(fields[b"unique_window"])
        elif "unique_key" in values and not fields[b"unique"]:
            del values["unique_key"]
        return cls(
            id=job_id,
            queue=queue,
            type=values.pop("type", ""),
            payload=values.pop("payload", b""),
            state=values.pop("state", State.PENDING),
            **values,
        )


#: Stored state -> State: a dict lookup costs a tenth of the enum's own.
_STATES: Final = {state.value.encode(): state for state in State}


def _state(raw: bytes | None) -> State:
    if not raw:
        return State.PENDING
    state = _STATES.get(raw)
    if state is None:
        raise ValueError(f"unknown job state {raw!r}")
    return state


def _refs(raw: bytes | None) -> tuple[str, ...]:
    """A JSON array of job references; a field that is not one (written by hand) reads as none."""
    if raw is None:
        return ()
    refs = json.loads(raw)
    return tuple(r for r in refs if isinstance(r, str)) if isinstance(refs, list) else ()


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _same(raw: bytes) -> bytes:
    return raw


#: The fields of a job hash that Job.from_hash reads, each with the Job field it fills and how its bytes are
#: read. `unique_window` and `held` are also looked at there: the former marks the unique key held for its whole
#: TTL (and names it when `unique` does not), the latter counts only while the job is held.
_FIELDS: Final[dict[bytes, tuple[str, Callable[[bytes], object]]]] = {
    b"type": ("type", _text),
    b"payload": ("payload", _same),
    b"state": ("state", _state),
    b"content_type": ("content_type", _text),
    b"attempt": ("attempt", int),
    b"max_attempts": ("max_attempts", int),
    b"timeout": ("timeout_ms", int),
    b"backoff": ("backoff_ms", int),
    b"created": ("created_ms", int),
    b"run_at": ("run_at_ms", int),
    b"started": ("started_ms", int),
    b"finished": ("finished_ms", int),
    b"token": ("token", _text),
    b"errors": ("errors", parse_errors),
    b"unique": ("unique_key", _text),
    b"traceparent": ("traceparent", _text),
    b"meta": ("meta", lambda raw: json.loads(raw) if raw else {}),
    b"batch": ("batch", _text),
    b"result": ("result", _same),
    b"result_dropped": ("result_dropped", _text),
    b"cancel": ("cancel_requested", lambda raw: raw == b"1"),
    b"priority": ("priority", int),
    b"expires_at": ("expires_at_ms", int),
    b"keep_for": ("keep_for_ms", int),
    b"debounce": ("debounce_key", _text),
    b"schedule": ("schedule", _text),
    b"scheduled_at": ("scheduled_at_ms", int),
    b"key": ("limit_key", _text),
    b"held": ("held_for", _text),
    b"held_at": ("held_at_ms", int),
    b"after": ("after", _refs),
    b"on_dependency_failure": ("on_dependency_failure", _text),
    b"progress": ("progress", parse_progress),
    b"parent": ("parent", _text),
}
