"""The log lines of attempts: the fields every line about one attempt carries, and the one line each finished
attempt logs, at the level its outcome deserves (attempts.py decides when; this module, what it says).
"""

from __future__ import annotations

import logging
from typing import Final

from jobcar.job import Job
from jobcar.outcome import Outcome, OutcomeKind
from jobcar.recording import OutcomeCall, Recorded

log = logging.getLogger("jobcar.attempts")

#: The level of the line each finished attempt logs (log_finished); others at info.
_LOG_LEVELS: Final = {
    Recorded.DONE: logging.DEBUG,
    Recorded.RETRIED: logging.INFO,
    Recorded.DEAD: logging.WARNING,
}


def log_fields(job: Job) -> dict[str, object]:
    """The fields every log line about one attempt carries; built only when a line is logged."""
    return {"queue": job.queue, "job_id": job.id, "type": job.type, "attempt": job.attempt}


def log_finished_enabled(recorded: Recorded) -> bool:
    """Whether the line of an attempt recorded so would be logged: asked first, as building it costs."""
    return log.isEnabledFor(_LOG_LEVELS.get(recorded, logging.INFO))


def log_finished(
    job: Job, outcome: Outcome, recorded: Recorded, recording: OutcomeCall, elapsed: float, max_attempts: int
) -> None:
    """One line per finished attempt, named as the metrics name it: a success at debug (a line per job
    would cost more than the job), a retry at info, a death at warning. The line says why in the
    executor's words before any handler output (`exit code 3`, `HTTP 503`, `timeout after 10.0s`):
    a handler's stderr or response body may echo the payload, so it is logged at debug only, and it
    is always in the job's error history (`jobcar jobs show`)."""
    level = _LOG_LEVELS.get(recorded, logging.INFO)
    fields = {**log_fields(job), "outcome": recorded.value, "duration_s": round(elapsed, 6)}
    why = _reason(outcome.error)
    if recorded is Recorded.RETRIED and not outcome.spend_attempt:
        log.log(level, "job retried: %s; the next try in %.1f s, attempt %d not spent", why,
                recording.retry_in or 0.0, job.attempt, extra=fields)  # fmt: skip
    elif recorded is Recorded.RETRIED:
        log.log(level, "job retried: %s; attempt %d of %d failed, the next in %.1f s", why, job.attempt,
                max_attempts, recording.retry_in or 0.0, extra=fields)  # fmt: skip
    elif recorded is Recorded.DEAD:
        spent = "attempts exhausted" if outcome.kind is OutcomeKind.RETRY else "a permanent failure"
        log.log(level, "job dead: %s (%s, attempt %d of %d); it is in the dead-letter queue", why, spent,
                job.attempt, max_attempts, extra=fields)  # fmt: skip
    else:
        log.log(level, "job %s", recorded.value, extra=fields)
    if outcome.error:
        log.debug("the attempt's error in full: %s", outcome.error, extra=fields)


def _reason(error: str | None) -> str:
    """The executor's own words of an error, before any handler output: `exit code 3: <stderr>` -> `exit code 3`."""
    if not error:
        return "no reason given"
    head = error.split(": ", 1)[0].strip()
    return head if len(head) <= 200 else head[:199] + "…"
