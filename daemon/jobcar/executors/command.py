"""The command executor: run the handler's program with the payload on stdin, and map how it ended to an
Outcome.

`command_process` runs the program: in a process group and tree of its own, its output read into bounded
captures, and its whole tree ended when the job is, so that nothing a handler forked outlives its job.

Outcomes: exit 0 → success with stdout as the result; an exit code in `permanent_exit_codes` → fail;
exit 75 (EX_TEMPFAIL) with a duration on stdout (`30s`) → a snooze, as the handler API's; any other exit,
death by a signal or a timeout → retry. The tail of stderr becomes the error text.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Final

from jobcar.attempt_desk import TOKEN_ENV, URL_ENV, LiveAttempt
from jobcar.config_types import DEFAULT_ENV_ALLOW, CommandHandler
from jobcar.executors.batch_wire import command_input, outcomes_from_lines
from jobcar.executors.command_process import Capture, CommandProcess, Ended
from jobcar.executors.guardian import Guardian
from jobcar.exit_codes import EX_TEMPFAIL
from jobcar.job import Job
from jobcar.outcome import MAX_ERROR_CHARS, Outcome
from jobcar.timestamps import rfc3339, rfc3339_ms
from jobcar.units import parse_duration

__all__ = ["SNOOZE_EXIT_CODE", "CommandExecutor"]

#: The exit code of a command that snoozes its job, its stdout the delay: "try again later", as jobcar's own.
SNOOZE_EXIT_CODE: Final = EX_TEMPFAIL


class CommandExecutor:
    """Runs jobs of one command handler. `guardian` (shared by the daemon) may be None: then only
    `PR_SET_PDEATHSIG` protects against handler processes outliving a killed daemon. `use_cgroups=False`
    holds process trees as where no cgroup can be created (the handler as subreaper)."""

    def __init__(self, handler: CommandHandler, guardian: Guardian | None, *, use_cgroups: bool = True) -> None:
        self.handler = handler
        self._process = CommandProcess(handler, guardian, use_cgroups=use_cgroups)
        names = (*DEFAULT_ENV_ALLOW, *handler.env_allow)
        # Read once: an allow-list, so the daemon's secrets, NOTIFY_SOCKET and WATCHDOG_* never reach a
        # handler unless named.
        self._base_env = {name: os.environ[name] for name in names if name in os.environ}

    def _environment(
        self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None
    ) -> dict[str, str]:
        env = {**self._base_env, **self.handler.env}
        env.update(
            {
                "JOBCAR_JOB_ID": job.id,
                "JOBCAR_JOB_TYPE": job.type,
                "JOBCAR_QUEUE": job.queue,
                "JOBCAR_ATTEMPT": str(job.attempt),
                "JOBCAR_MAX_ATTEMPTS": str(max_attempts),
                "JOBCAR_DEADLINE": rfc3339(deadline),
                "JOBCAR_ENQUEUED_AT": rfc3339(job.created_ms / 1000),
                "JOBCAR_CONTENT_TYPE": job.content_type,
            }
        )
        traceparent = attempt.traceparent if attempt is not None and attempt.traceparent else job.traceparent
        if traceparent:  # the handler call's span while tracing is on (tracing.py), else the job's own
            env["TRACEPARENT"] = traceparent
        if job.scheduled_at_ms is not None:  # a periodic job: which schedule, and which of its ticks
            env["JOBCAR_SCHEDULE"] = job.schedule or ""
            env["JOBCAR_SCHEDULED_AT"] = rfc3339_ms(job.scheduled_at_ms) or ""
        if job.after_header:
            env["JOBCAR_AFTER"] = job.after_header
        if attempt is not None:  # where the handler calls back during the attempt
            env[URL_ENV] = attempt.url
            env[TOKEN_ENV] = attempt.token
        return env

    def _batch_environment(self, first: Job, count: int, *, deadline: float) -> dict[str, str]:
        """A batch's own variables: what its jobs share (a batch holds one type of one queue)."""
        env = {**self._base_env, **self.handler.env}
        env.update(
            {
                "JOBCAR_JOB_TYPE": first.type,
                "JOBCAR_QUEUE": first.queue,
                "JOBCAR_BATCH_SIZE": str(count),
                "JOBCAR_DEADLINE": rfc3339(deadline),
            }
        )
        return env

    async def run(self, job: Job, *, deadline: float, max_attempts: int, attempt: LiveAttempt | None = None) -> Outcome:
        handler = self.handler
        started = time.time()
        budget = min(handler.timeout, deadline - started)
        if budget <= 0:
            return Outcome.retry("timeout: the job's deadline passed before the command started")
        env = self._environment(job, deadline=deadline, max_attempts=max_attempts, attempt=attempt)
        stdout = Capture(handler.max_output_bytes, keep_tail=False)
        stderr_lines = attempt.stderr_lines if attempt is not None else None
        tee = _lines_to(stderr_lines.add) if stderr_lines is not None else None
        stderr = Capture(handler.max_output_bytes, keep_tail=True, tee=tee)
        extendable = attempt if attempt is not None and attempt.extendable else None
        if extendable is not None:
            extendable.deadline = started + budget
        ended = await self._process.run(env, job.payload, budget, stdout, stderr, extendable)
        if tee is not None and stderr_lines is not None:
            tee(b"\n")  # the last line, if it had no line break
            await stderr_lines.flush()  # written while the lease still fences them, before the outcome
        if isinstance(ended, Outcome):
            return ended
        if extendable is not None and ended.timed_out:
            ended = dataclasses.replace(ended, budget=extendable.deadline - started)
        return self._outcome(ended, stdout, stderr)

    async def run_batch(
        self,
        jobs: Sequence[Job],
        *,
        deadline: float,
        max_attempts: Sequence[int],
        attempts: Sequence[LiveAttempt] = (),
    ) -> list[Outcome]:
        """Run the command once with the jobs as JSON lines on stdin; each job's outcome is its answer line on
        stdout (`batch_wire`). A job without one gets the run's own outcome, even after exit 0: no answer is
        never a success. Answers printed before a crash or a timeout still count."""
        handler = self.handler
        count = len(jobs)
        budget = min(handler.timeout, deadline - time.time())
        if budget <= 0:
            return [Outcome.retry("timeout: the batch's deadline passed before the command started")] * count
        env = self._batch_environment(jobs[0], count, deadline=deadline)
        stdout = Capture(handler.max_output_bytes * count, keep_tail=False)
        stderr = Capture(handler.max_output_bytes, keep_tail=True)
        ended = await self._process.run(env, command_input(jobs, max_attempts, attempts), budget, stdout, stderr)
        if isinstance(ended, Outcome):
            return [ended] * count
        answers = outcomes_from_lines(jobs, stdout.data, result_limit=handler.max_output_bytes,
                                      max_retry_after=handler.max_retry_after)  # fmt: skip
        if ended.code == 0 and not ended.timed_out:
            unanswered = Outcome.retry(_error_text("batch answer: the command printed no answer line for this job",
                                                   Capture(0, keep_tail=False), stderr))  # fmt: skip
        else:
            unanswered = self._outcome(ended, stdout, stderr)
        return [answer or unanswered for answer in answers]

    def _outcome(self, ended: Ended, stdout: Capture, stderr: Capture) -> Outcome:
        """Exit 0: success, stdout the result; a permanent exit code: fail; anything else: retry."""
        code = ended.code
        if ended.timed_out:
            head = f"timeout after {ended.budget:.1f}s"
            if ended.forced:
                head += f" (still running {self.handler.kill_grace:g}s after SIGTERM; killed with SIGKILL)"
            return Outcome.retry(_error_text(head, stdout, stderr))
        if code == 0:
            result = stdout.data
            if stdout.truncated:
                result += f"\n[jobcar: stdout truncated: kept {len(result)} of {stdout.total} bytes]".encode()
            return Outcome.success(result)
        if code is not None and code < 0:
            return Outcome.retry(_error_text(f"killed by signal {_signal_name(-code)}", stdout, stderr))
        if code in self.handler.permanent_exit_codes:
            return Outcome.fail(_error_text(f"exit code {code}", stdout, stderr))
        if code == SNOOZE_EXIT_CODE:
            try:
                delay = parse_duration(stdout.data.decode("utf-8", errors="replace").strip())
            except ValueError as exc:
                return Outcome.retry(_error_text(f"exit code {code} (a snooze) without a delay on stdout: {exc}",
                                                 Capture(0, keep_tail=False), stderr))  # fmt: skip
            return Outcome.snooze(min(delay, self.handler.max_retry_after))
        return Outcome.retry(_error_text(f"exit code {code}", stdout, stderr))


def _lines_to(sink: Callable[[list[str]], None]) -> Callable[[bytes], None]:
    """A stream's chunks as whole lines to `sink` (a partial line waits for its end; b"\\n" flushes it)."""
    pending = bytearray()

    def feed(chunk: bytes) -> None:
        pending.extend(chunk)
        end = pending.rfind(b"\n")
        if end < 0:
            return
        lines = bytes(pending[:end]).decode("utf-8", errors="replace").split("\n")
        del pending[: end + 1]
        sink([line for line in lines if line.strip()])

    return feed


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _error_text(head: str, stdout: Capture, stderr: Capture) -> str:
    """`head`, truncation notes, then the end of stderr (or the start of stdout if stderr is empty),
    cut so that `head` survives `Outcome`'s bound on error length."""
    notes = [
        f"{name} truncated: {capture.total} bytes"
        for name, capture in (("stdout", stdout), ("stderr", stderr))
        if capture.truncated
    ]
    prefix = head + (f" ({'; '.join(notes)})" if notes else "")
    detail = stderr.data.decode("utf-8", errors="replace").strip()
    from_stdout = not detail
    if from_stdout:
        detail = stdout.data.decode("utf-8", errors="replace").strip()
        if detail:
            detail = "stdout: " + detail
    if not detail:
        return prefix
    room = MAX_ERROR_CHARS - len(prefix) - 2
    if len(detail) > room:
        detail = detail[: room - 1] + "…" if from_stdout else "…" + detail[-(room - 1) :]
    return f"{prefix}: {detail}"
