"""Jobs that wait for others (`after=`, ADR 0016), on the producer's side, without I/O: in which order to
store the jobs of one call, whom to register with afterwards, and what to tell a waiting job whose
dependency had already ended.

A job that waits for another of the same call is stored first, and the other is stored naming it
(`dependents`): a dependency can then never end before the jobs waiting for it are known, whatever the
queues and the nodes. A job named by id that was enqueued earlier is registered with after the waiting job
is stored (the `depend` script, on the dependency's slot); one that has ended already is told to the
waiting job at once (`settle`). Standard library only: producers (a Spark executor) import it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobcar.dependency_calls import DependOutcome, depend_call, settle_call
from jobcar.enqueueing import EnqueueRecord
from jobcar.errors import InvalidJob
from jobcar.job import EnqueueStatus, JobInfo, State
from jobcar.keys import QueueKeys, job_ref, split_job_ref
from jobcar.names import ID_PATTERN, check_name
from jobcar.scripts import ScriptCall

#: What a job may wait for: at most this many dependencies (each costs a call when it was enqueued earlier).
MAX_AFTER: Final = 100_000
ON_DEPENDENCY_FAILURE: Final = ("fail", "run", "cancel")
#: A batch's callbacks wait for "<queue>/batch:<id>": no job id starts so.
BATCH_REF_PREFIX: Final = "batch:"


def after_refs(after: object, queue: str) -> tuple[str, ...]:
    """The references of the `after=` option: job ids (in the job's own queue), (queue, id) pairs, or what
    `enqueue` returned (a JobInfo, a Job: anything with `id` and `queue`). One of them alone is taken as
    a list of one."""
    items = list(after) if isinstance(after, Iterable) and not isinstance(after, (str, tuple)) else [after]
    if not items:
        raise InvalidJob("after names no job: give one or more job ids")
    if len(items) > MAX_AFTER:
        raise InvalidJob(f"after names {len(items)} jobs, more than {MAX_AFTER}")
    return tuple(dict.fromkeys(_ref_of(item, queue) for item in items))


def _ref_of(item: Any, queue: str) -> str:
    if isinstance(item, str):
        return job_ref(queue, check_name("job id in after", item, ID_PATTERN))
    if isinstance(item, (tuple, list)) and len(item) == 2:  # a list: from JSON (the HTTP API)
        other, job_id = item
    elif hasattr(item, "id") and hasattr(item, "queue"):
        other, job_id = item.queue, item.id
    else:
        raise InvalidJob(f"after takes job ids, (queue, id) pairs or enqueued jobs, not {item!r}")
    return job_ref(check_name("queue name in after", other), check_name("job id in after", job_id, ID_PATTERN))


def on_dependency_failure(value: object) -> str | None:
    """The option as stored: None for the default, "fail"."""
    if value is None or value == "fail":
        return None
    if value not in ON_DEPENDENCY_FAILURE:
        raise InvalidJob(f"on_dependency_failure must be one of {', '.join(ON_DEPENDENCY_FAILURE)}, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class EnqueueOrder:
    """The records of one call in the order to store them: each stage after the previous one has been
    stored. `later` are (waiting record, dependency reference) pairs to register once everything is."""

    stages: list[list[EnqueueRecord]]
    later: list[tuple[EnqueueRecord, str]]


def enqueue_order(records: list[EnqueueRecord]) -> EnqueueOrder:
    """Jobs waiting for jobs of the same call go first, one stage per level; the dependencies carry them
    as `dependents`. Without `after` anywhere, one stage: the records as given."""
    if not any(r.after for r in records):
        return EnqueueOrder([records], [])
    by_ref = {job_ref(r.queue, r.id): i for i, r in enumerate(records)}
    if len(by_ref) < len(records):
        raise InvalidJob("two jobs of one call have the same queue and job_id: after could not tell them apart")
    dependents: list[list[str]] = [[] for _ in records]
    later = []
    for r in records:
        for ref in r.after:
            index = by_ref.get(ref)
            if index is None:
                later.append((r, ref))
            else:
                dependents[index].append(job_ref(r.queue, r.id))
    levels = _levels(records, dependents, by_ref)
    stored = [dataclasses.replace(r, dependents=tuple(d)) if d else r for r, d in zip(records, dependents, strict=True)]
    stages: list[list[EnqueueRecord]] = [[] for _ in range(max(levels) + 1)]
    for record, level in zip(stored, levels, strict=True):
        stages[level].append(record)
    return EnqueueOrder(stages, later)


def _levels(records: Sequence[EnqueueRecord], dependents: list[list[str]], by_ref: dict[str, int]) -> list[int]:
    """A record's stage: 0 when nothing of the call waits for it, else one more than its dependents'
    highest. Worked out from the records nothing waits for, inward, each edge once (a fan-out of 10,000 is
    as cheap as a chain of 10,000). A cycle is refused: its jobs would wait forever."""
    waits_for: list[list[int]] = [[] for _ in records]  # the call's records each waits for
    unleveled = [len(d) for d in dependents]  # the dependents of each record not leveled yet
    for index, refs in enumerate(dependents):
        for ref in refs:
            waits_for[by_ref[ref]].append(index)
    levels = [0] * len(records)
    ready = [index for index, n in enumerate(unleveled) if n == 0]
    for node in ready:  # grows while it is walked: each record once, when its last dependent is leveled
        for dependency in waits_for[node]:
            levels[dependency] = max(levels[dependency], levels[node] + 1)
            unleveled[dependency] -= 1
            if unleveled[dependency] == 0:
                ready.append(dependency)
    if len(ready) < len(records):
        stuck = next(index for index, n in enumerate(unleveled) if n > 0)
        raise InvalidJob(f"after makes a cycle among the jobs of this call: job {records[stuck].id} would wait forever")
    return levels


def chained(records: Sequence[EnqueueRecord]) -> list[EnqueueRecord]:
    """`client.chain`: each record waits for the one before it (besides what its own `after` names)."""
    steps = list(records[:1])
    for before, record in itertools.pairwise(records):
        steps.append(dataclasses.replace(record, after=(*record.after, job_ref(before.queue, before.id))))
    return steps


def ref_of(record: EnqueueRecord) -> str:
    return job_ref(record.queue, record.id)


def depend_calls(
    namespace: str, later: Sequence[tuple[EnqueueRecord, str]], infos: dict[str, JobInfo]
) -> list[tuple[tuple[EnqueueRecord, str], ScriptCall]]:
    """Register each waiting record this call stored with its dependency enqueued earlier, on the
    dependency's slot: the pairs of `later` that need it, each with its call."""
    calls = []
    for record, ref in later:
        if infos[ref_of(record)].status is not EnqueueStatus.CREATED:
            continue  # not stored by this call (its id existed, its unique key was held): nothing waits
        queue, job_id = split_job_ref(ref)
        pair = (record, ref)
        calls.append((pair, depend_call(QueueKeys.of(namespace, queue), job_id, ref_of(record))))
    return calls


def settle_calls(
    namespace: str, registered: Sequence[tuple[EnqueueRecord, str]], outcomes: Sequence[DependOutcome]
) -> list[ScriptCall]:
    """Tell the waiting jobs about the dependencies `depend` found ended (or gone)."""
    calls = []
    for (record, ref), outcome in zip(registered, outcomes, strict=True):
        if outcome is not DependOutcome.REGISTERED:
            calls.append(settle_call(QueueKeys.of(namespace, record.queue), record.id, [ref], outcome.value))
    return calls


#: The states of a kept job that has ended: what it tells the jobs waiting for it is its state.
_ENDED: Final = frozenset({State.DONE, State.DEAD, State.CANCELED})


def silent_dependency_calls(
    namespace: str, records: Iterable[EnqueueRecord], infos: dict[str, JobInfo]
) -> list[ScriptCall]:
    """The records carrying dependents that will never tell them, and what they are told now: one whose id
    existed and had ended (done, dead, or canceled and kept), or one not stored at all (its unique key was
    held, or it was debounced into a waiting job: gone)."""
    calls = []
    for r in records:
        ref = ref_of(r)
        info = infos[ref]
        if not r.dependents or info.status is EnqueueStatus.CREATED:
            continue
        if info.status is EnqueueStatus.EXISTS:
            if info.state not in _ENDED:
                continue  # it has not ended: the enqueue registered them with it
            outcome = info.state.value
        else:
            outcome = DependOutcome.GONE.value
        for waiting in r.dependents:
            queue, job_id = split_job_ref(waiting)
            calls.append(settle_call(QueueKeys.of(namespace, queue), job_id, [ref], outcome))
    return calls
