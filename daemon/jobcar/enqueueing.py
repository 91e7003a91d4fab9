"""The enqueue transition: a job as the record the scripts store, the calls that store records (one per
queue and chunk), their replies read back in the records' order; pure functions, no I/O.

Only the standard library is imported: producers, including a Spark executor with jobcar as a zip, store
jobs through here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from jobcar.errors import QueueFull
from jobcar.job import EnqueueStatus, JobInfo, State
from jobcar.keys import QueueKeys
from jobcar.replies import as_list, as_text
from jobcar.scripts import Arg, Reply, ScriptCall, call

#: Jobs per enqueue script call in enqueue_many: big enough to amortise the round trip, small enough
#: that one call never blocks the server for long.
ENQUEUE_CHUNK: Final = 500


@dataclass(slots=True)  # not frozen: its __init__ then costs a fifth of build_record, per job of enqueue_many
class EnqueueRecord:
    """One job to store, already validated and encoded by the client. Treat it as read-only."""

    id: str
    queue: str
    type: str
    payload: bytes
    content_type: str | None = None  # None: the default, application/json (not stored)
    run_at_ms: int = 0  # absolute run-at, producer's clock; 0: none
    delay_ms: int = 0  # relative to Redis time; 0: none
    unique_key: str | None = None
    unique_ttl_ms: int = 0
    max_attempts: int | None = None
    timeout_ms: int | None = None
    backoff_ms: int | None = None  # the first retry's delay, in place of the handler's backoff base
    traceparent: str | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    batch: str | None = None
    priority: int = 0  # 0 (the default, not stored) to 9
    expires_at_ms: int | None = None  # absolute, producer's clock
    expires_in_ms: int | None = None  # relative to Redis time at enqueue
    unique_window: bool = False  # the unique key is held for its whole TTL
    debounce_key: str | None = None
    debounce_ms: int | None = None
    debounce_max_ms: int | None = None
    key: str | None = None  # for per-key limits
    after: Sequence[str] = ()  # references "<queue>/<id>" of the jobs this one waits for (ADR 0016)
    on_dependency_failure: str | None = None  # "fail" (the default, not stored), "run" or "cancel"
    dependents: Sequence[str] = ()  # references of jobs stored before this one that wait for it
    parent: str | None = None  # the reference of the job whose handler made this one (the handler API)
    keep_for_ms: int | None = None  # the id (and result) kept this long after the job ends (ack.lua)

    def args(self) -> list[Arg]:
        """The record as the scripts that store jobs read it (`lua/includes/store_jobs.lua`)."""
        extra = self.optional_fields()
        return [self.id, self.type, self.payload, self.run_at_ms, self.delay_ms, self.unique_key or "",
                self.unique_ttl_ms, len(extra) // 2, *extra]  # fmt: skip

    def optional_fields(self) -> list[Arg]:
        """Hash fields beyond type and payload, only those given (every field costs memory per job)."""
        out: list[Arg] = []
        optional: tuple[tuple[str, Arg | None], ...] = (
            ("content_type", self.content_type),
            ("max_attempts", self.max_attempts),
            ("timeout", self.timeout_ms),
            ("traceparent", self.traceparent),
            ("meta", json.dumps(dict(self.meta), separators=(",", ":")) if self.meta else None),
            ("batch", self.batch),
            ("key", self.key),
        )
        # Checked first, so that a job without them (enqueue_many's usual job) pays little (ADR 0006).
        if (self.priority or self.expires_at_ms or self.expires_in_ms or self.unique_window or self.debounce_key
                or self.backoff_ms or self.keep_for_ms):  # fmt: skip
            optional += (
                ("priority", self.priority or None),
                ("keep_for", self.keep_for_ms),
                ("backoff", self.backoff_ms),
                ("expires_at", self.expires_at_ms),
                ("expires_in", self.expires_in_ms),
                ("unique_mode", "window" if self.unique_window else None),
                ("debounce_key", self.debounce_key),
                ("debounce_ms", self.debounce_ms),
                ("debounce_max_ms", self.debounce_max_ms),
            )
        if self.after or self.dependents or self.parent:
            optional += (
                ("after", json.dumps(list(self.after)) if self.after else None),
                ("on_dependency_failure", self.on_dependency_failure),
                ("dependents", json.dumps(list(self.dependents)) if self.dependents else None),
                ("parent", self.parent),
            )
        for name, value in optional:
            if value is not None:
                out += [name, value]
        return out


def _by_queue(records: Sequence[EnqueueRecord]) -> dict[str, list[int]]:
    """Record indexes grouped per queue, queues in first-seen order, records in order within each."""
    groups: dict[str, list[int]] = {}
    for index, r in enumerate(records):
        groups.setdefault(r.queue, []).append(index)
    return groups


def _chunks(records: Sequence[EnqueueRecord]) -> list[list[int]]:
    """The record indexes of each enqueue call: per queue (first-seen order), per ENQUEUE_CHUNK records."""
    if len(records) == 1:  # a single enqueue: the hot path of many producers, asked twice per call
        return [[0]]
    return [indexes[start : start + ENQUEUE_CHUNK] for indexes in _by_queue(records).values()
            for start in range(0, len(indexes), ENQUEUE_CHUNK)]  # fmt: skip


def enqueue_calls(namespace: str, records: Sequence[EnqueueRecord]) -> list[ScriptCall]:
    """One enqueue call per queue and chunk of ENQUEUE_CHUNK records (a call touches one queue/slot)."""
    calls: list[ScriptCall] = []
    for chunk in _chunks(records):
        keys = QueueKeys.of(namespace, records[chunk[0]].queue)
        args: list[Arg] = [keys.prefix]
        for index in chunk:
            args += records[index].args()
        calls.append(call("enqueue", (keys.pending, keys.scheduled, keys.wake), args))
    return calls


_CREATED_STATES: Final = {b"pending": State.PENDING, b"scheduled": State.SCHEDULED, b"waiting": State.WAITING}
#: The enqueue script's refusal by backpressure (lua/includes/max_pending.lua, ADR 0024): by the queue's bound,
#: or by a type's ("of type <type>"; a type name holds no newline).
_FULL: Final = re.compile(r"FULL jobcar enqueue: (\d+) pending(?: of type (.+))?, max_pending (\d+), (\d+) new refused")


class FullRefusal(NamedTuple):
    """An enqueue call's backpressure refusal: the jobs pending or held (of `job_type`, when a type's bound
    refused it, else of the queue), the bound, and the call's new jobs refused."""

    pending: int
    max_pending: int
    refused: int
    job_type: str | None


def full_refusal(reply: Reply) -> FullRefusal | None:
    """The backpressure refusal an enqueue call's reply is, else None."""
    if not isinstance(reply, Exception):
        return None
    match = _FULL.fullmatch(str(reply))
    return FullRefusal(int(match[1]), int(match[3]), int(match[4]), match[2]) if match else None


def parse_enqueue(records: Sequence[EnqueueRecord], replies: Sequence[Reply]) -> list[JobInfo]:
    """Pair the replies of `enqueue_calls(records)` with the records, in the records' order. A call refused by
    backpressure raises QueueFull once every reply is read (the jobs the other calls stored in it); another
    error reply is raised as it is."""
    infos: list[JobInfo | None] = [None] * len(records)
    full: tuple[str, FullRefusal] | None = None
    refused = 0
    for chunk, reply in zip(_chunks(records), replies, strict=True):
        if isinstance(reply, Exception):
            counts = full_refusal(reply)
            if counts is None:
                raise reply
            full = full or (records[chunk[0]].queue, counts)
            refused += counts.refused
            continue
        for index, entry in zip(chunk, as_list(reply), strict=True):
            record = records[index]
            if isinstance(entry, bytes):  # the common case, kept cheap: created, in this state
                created = _CREATED_STATES.get(entry) or State(entry.decode())
                infos[index] = JobInfo(record.id, record.queue, created, EnqueueStatus.CREATED)
            else:
                status, job_id, state = (as_text(x) for x in as_list(entry))
                infos[index] = JobInfo(job_id, record.queue, State(state), EnqueueStatus(status))
    stored = [info for info in infos if info is not None]
    if full is not None:
        queue, first = full
        raise QueueFull(queue, first.pending, first.max_pending, refused, stored, job_type=first.job_type)
    return stored
