"""Executors run one job against one handler and say what came of it as an `Outcome`.

`http.HttpExecutor` POSTs the payload to a URL; `command.CommandExecutor` runs a program with the payload
on stdin (and `guardian.Guardian` makes sure no handler process outlives the daemon). The runner only
knows this protocol: it never sees HTTP statuses or exit codes. This module imports neither aiohttp nor
the executors, so the guardian's watchdog (`python -m jobcar.executors.guardian`) starts light.
"""

from __future__ import annotations

from typing import Protocol

from jobcar.job import Job
from jobcar.outcome import Outcome

__all__ = ["Executor"]


class Executor(Protocol):
    """Runs jobs of one handler. One instance per configured handler, shared by all its running jobs."""

    async def run(self, job: Job, *, deadline: float, max_attempts: int) -> Outcome:
        """Run `job` once and report the outcome; never raises for anything the handler did.

        `deadline` is the end of the job's own timeout as `time.time()` epoch seconds; the handler's
        `timeout` may end it sooner. `max_attempts` is the effective limit (the job's, else the
        handler's), passed on to the handler as metadata. Cancelling the call stops the handler
        (aborts the request, or kills the process group) before `CancelledError` propagates.
        """
        ...
