"""The transitions of jobs that wait for others (ADR 0016): a waiting job registered with a dependency,
told how its dependencies ended, a batch sealed; each a call to build, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

from jobcar.keys import QueueKeys
from jobcar.scripts import ScriptCall, call
from jobcar.transitions import DeadLetterLimits

#: The dead set's limits for a caller that names none: DeadLetterLimits' defaults.
DEFAULT_DEAD: Final = DeadLetterLimits()


class DependOutcome(StrEnum):
    """What `depend` found: the dependency will tell the waiting job, or what to tell it now."""

    REGISTERED = "registered"
    DONE = "done"
    DEAD = "dead"
    CANCELED = "canceled"
    GONE = "gone"


def depend_call(keys: QueueKeys, job_id: str, waiting_ref: str) -> ScriptCall:
    """Register the job `waiting_ref` with its dependency `job_id` of `keys`' queue (on that queue's slot)."""
    return call("depend", (keys.job(job_id),), (keys.prefix, job_id, waiting_ref))


def settle_call(
    keys: QueueKeys,
    job_id: str,
    dependency_refs: Sequence[str],
    outcome: str,
    dead: DeadLetterLimits = DEFAULT_DEAD,
    batch_counts: str = "",
) -> ScriptCall:
    """Tell the waiting job `job_id` of `keys`' queue that its dependencies `dependency_refs` ended, all as
    `outcome`; for a batch's callback, with the batch's counts (JSON), which its payload then carries."""
    return call(
        "settle",
        (keys.pending, keys.waiting, keys.dead, keys.wake, keys.job(job_id)),
        (keys.prefix, job_id, outcome, dead.max_jobs, dead.max_age_ms, batch_counts, *dependency_refs),
    )


class SealResult(StrEnum):
    """What sealing a batch did (`seal_batch_call`)."""

    SEALED = "sealed"  # its callbacks are told when its last job ends
    COMPLETE = "complete"  # every job had ended: its callbacks were told now
    FIRED = "fired"  # sealed and told before: nothing changed


def seal_batch_call(keys: QueueKeys, batch_id: str, callbacks: Sequence[str]) -> ScriptCall:
    """Every job of the batch is enqueued; `callbacks` (references of jobs waiting for "<queue>/batch:<id>")
    are told once all of its jobs have ended."""
    return call("seal_batch", (keys.batch(batch_id),), (keys.prefix, batch_id, *callbacks))
