"""One job as operators read it (`JobView`, for every surface): its hash, its lease, the jobs it waits for and
those waiting for it, and what its handlers wrote beside it through the handler API: its log's lines (`LogRead`),
its steps, its first children with their states. The types, the read of that handler data beside the job's hash
(`with_handler_data`) and the decoding of its replies; `AdminReads` reads the hash and the log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobcar.job import Job, State
from jobcar.job_document import job_document
from jobcar.keys import QueueKeys, split_job_ref
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import call
from jobcar.timestamps import rfc3339_ms
from jobcar.transport import AsyncRedis, execute_async

#: The children a job's view reads (with their states), oldest first; it counts them all.
CHILDREN_SHOWN: Final = 100


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A durable step a job's handler kept (the handler API), without its result."""

    name: str
    #: The bytes of its result.
    size: int
    #: When it was written (ms), or None for a value not written by the step script.
    at_ms: int | None


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """A job a job's handler made as its child."""

    ref: str
    created_ms: int
    #: Its state now; None once it is gone (it ended without a kept result, or was canceled) or unreadable.
    state: State | None


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line of a job's log: when (ms; None for an entry jobcar did not write), from which attempt."""

    at_ms: int | None
    attempt: int
    line: str


@dataclass(frozen=True, slots=True)
class LogRead:
    """Lines of a job's log from one index on (`AdminReads.log_since`)."""

    #: The job's state then (None: it is gone, with its log).
    state: State | None
    #: Lines dropped (oldest first, by its bounds) before the first one read, since the index asked for.
    missed: int
    entries: tuple[LogEntry, ...]
    #: The index to ask for next: every line ever written counts, dropped ones too.
    next_index: int


@dataclass(frozen=True, slots=True)
class JobView:
    job: Job
    #: The lease deadline (Redis ms) of an active job; None otherwise.
    lease_deadline_ms: int | None
    #: Redis time when it was read, the clock every stored time was taken with.
    now_ms: int
    #: Of the jobs it waits for (`after`), those that have not ended yet, as references "<queue>/<id>".
    waiting_for: tuple[str, ...] = ()
    #: The jobs waiting for it to end (ADR 0016).
    dependents: tuple[str, ...] = ()
    #: What its handlers wrote through the handler API: its log's lines kept and dropped, its steps (by name)
    #: and its first CHILDREN_SHOWN children (oldest first) of `children_total`.
    log_lines: int = 0
    log_dropped: int = 0
    steps: tuple[StepInfo, ...] = ()
    children: tuple[ChildInfo, ...] = ()
    children_total: int = 0

    def document(self) -> dict[str, Any]:
        """The job as JSON (`job_document`), with what this view read beside its hash."""
        document = job_document(self.job, self.lease_deadline_ms, self.waiting_for, self.dependents)
        document["log"] = {"lines": self.log_lines, "dropped": self.log_dropped}
        document["steps"] = [{"name": s.name, "bytes": s.size, "at": rfc3339_ms(s.at_ms)} for s in self.steps]
        document["children"] = [
            {"ref": c.ref, "state": None if c.state is None else c.state.value, "created_at": rfc3339_ms(c.created_ms)}
            for c in self.children
        ]
        document["children_total"] = self.children_total
        return document


async def with_handler_data(redis: AsyncRedis, namespace: str, view: JobView, fields: Mapping[bytes, bytes]) -> JobView:
    """`view` with its log's size, its steps and its first children with their states."""
    keys, job_id = QueueKeys.of(namespace, view.job.queue), view.job.id
    pipe = redis.pipeline(transaction=False)
    pipe.llen(keys.log(job_id))
    pipe.zcard(keys.children(job_id))
    pipe.zrange(keys.children(job_id), 0, CHILDREN_SHOWN - 1, withscores=True)
    # A key of another type (fsck reports it) reads as none.
    (lines, total, members), (steps,) = await asyncio.gather(
        pipe.execute(raise_on_error=False),
        execute_async(redis, [call("step_list", (keys.steps(job_id),), ())], raise_on_error=False),
    )
    children = [(as_text(ref), int(score)) for ref, score in members] if isinstance(members, list) else []
    states = await _ref_states(redis, namespace, [ref for ref, _ in children])
    dropped = fields.get(b"log_dropped", b"0")
    return JobView(
        view.job, view.lease_deadline_ms, view.now_ms, view.waiting_for, view.dependents,
        log_lines=lines if isinstance(lines, int) else 0,
        log_dropped=int(dropped) if dropped.isdigit() else 0,
        steps=_steps(steps),
        children=tuple(ChildInfo(ref, at, state) for (ref, at), state in zip(children, states, strict=True)),
        children_total=total if isinstance(total, int) else 0,
    )  # fmt: skip


async def _ref_states(redis: AsyncRedis, namespace: str, refs: Sequence[str]) -> list[State | None]:
    """The states of these jobs ("<queue>/<id>"), in one round trip; None for one gone or unreadable."""
    if not refs:
        return []
    pipe = redis.pipeline(transaction=False)
    for ref in refs:
        queue, job_id = split_job_ref(ref)
        pipe.hget(QueueKeys.of(namespace, queue).job(job_id), "state")
    return [state_or_none(reply) for reply in await pipe.execute(raise_on_error=False)]


def _steps(reply: object) -> tuple[StepInfo, ...]:
    """The step list script's reply, by name; a reply that is not one (an error) reads as none."""
    if not isinstance(reply, list):
        return ()
    items = as_list(reply)
    steps = []
    for i in range(0, len(items) - 2, 3):
        at, size = as_text(items[i + 1]), as_int(items[i + 2])
        at_ms = int(at) if at else None
        steps.append(StepInfo(as_text(items[i]), max(0, size - len(at) - 1) if at else size, at_ms))
    return tuple(sorted(steps, key=lambda step: step.name))


def log_entry(raw: object) -> LogEntry:
    """An entry of a job's log; one that is not the documented JSON (written by hand) is shown as its text."""
    text = as_text(raw if isinstance(raw, bytes | str | int) else b"")
    try:
        entry = json.loads(text)
        return LogEntry(int(entry["at"]), int(entry["attempt"]), str(entry["line"]))
    except (ValueError, KeyError, TypeError):
        return LogEntry(None, 0, text)


def state_or_none(reply: object) -> State | None:
    if not isinstance(reply, bytes | str):
        return None
    try:
        return State(as_text(reply))
    except ValueError:
        return None
