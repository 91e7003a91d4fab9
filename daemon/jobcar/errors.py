"""Exceptions a producer may catch. Standard library only (the client imports this)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobcar.job import JobInfo


class JobcarError(Exception):
    """Base of jobcar's own errors."""


class InvalidJob(JobcarError, ValueError):
    """The job cannot be enqueued as given (bad type or queue name, bad option, bad payload)."""


class PayloadTooLarge(InvalidJob):
    """The encoded payload is over the client's `max_payload_bytes`."""


class TargetWarning(UserWarning):
    """A client made with `from_config` enqueued a job of a type no handler of that config runs, or to a queue
    it does not serve (with the config's `strict_enqueue`, an InvalidJob instead)."""


class QueueFull(JobcarError):
    """An enqueue refused by backpressure (ADR 0024): the queue's pending and held jobs and the call's new ones
    would be more than its `max_pending`, or those of one type (`job_type`) more than the type's. Nothing of the
    refused calls was written: try again later (`retry_after` seconds is a hint), or with fewer jobs. A call of
    more than 500 jobs, or to several queues, is stored in parts, each all or nothing: `stored` holds the JobInfo
    of the jobs stored by its other parts, in order."""

    #: The hint given as `retry_after` (and the HTTP API's `Retry-After`), in seconds.
    RETRY_AFTER_SECONDS = 1

    def __init__(
        self,
        queue: str,
        pending: int,
        max_pending: int,
        refused: int,
        stored: Sequence[JobInfo] = (),
        *,
        job_type: str | None = None,
    ) -> None:
        self.queue, self.pending, self.max_pending, self.refused = queue, pending, max_pending, refused
        self.job_type = job_type
        self.stored = list(stored)
        self.retry_after = self.RETRY_AFTER_SECONDS
        jobs = "job" if refused == 1 else "jobs"
        of_type = "" if job_type is None else f" of type {job_type}"
        super().__init__(
            f"queue {queue} is full: {pending} pending{of_type}, max_pending {max_pending}; {refused} {jobs} "
            f"refused, try again later"
        )
