"""Executors run one job against one handler and say what came of it as an `Outcome`.

`http.HttpExecutor` POSTs the payload to a URL; `command.CommandExecutor` runs a program with the payload
on stdin (and `guardian.Guardian` makes sure no handler process outlives the daemon). Both also run a batch
of jobs in one call, in the format of `batch_wire.py`. The runner only knows this protocol: it never sees
HTTP statuses or exit codes. This module imports neither aiohttp nor the executors, so the guardian's
watchdog (`python -m jobcar.executors.guardian`) starts light.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from jobcar.attempt_desk import LiveAttempt
from jobcar.job import Job
from jobcar.outcome import Outcome

__all__ = ["BatchExecutor", "Executor"]


class Executor(Protocol):
    """Runs jobs of one handler. One instance per configured handler, shared by all its running jobs."""

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        """Run `job` once and report the outcome; never raises for anything the handler did.

        `deadline` is the end of the job's own timeout as `time.time()` epoch seconds; the handler's
        `timeout` may end it sooner. `max_attempts` is the effective limit (the job's, else the
        handler's), passed on to the handler as metadata. `attempt`, when given, is what the handler may
        call back (its URL and token go with the job), and an extendable one sets the timeout: its
        deadline, which moves when the handler asks for more time. Cancelling the call stops the handler
        (aborts the request, or kills the process group) before `CancelledError` propagates.
        """
        ...


@runtime_checkable
class BatchExecutor(Executor, Protocol):
    """An executor that can also run many jobs of its handler in one call (a handler with `batch`)."""

    async def run_batch(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float,
        max_attempts: Sequence[int],
        attempts: Sequence[LiveAttempt] = (),
    ) -> list[Outcome]:
        """Run `jobs` (one type, one queue, distinct ids) in one call: one Outcome per job, in their order.

        As `run`, for the batch as a whole: `deadline` ends the call, and cancelling it stops the handler.
        `attempts`, when given, holds each job's attempt (its URL and token go with that job).
        """
        ...
