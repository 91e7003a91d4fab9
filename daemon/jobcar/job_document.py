"""`job_document`: a job as JSON, the one form the CLI, the HTTP API and the dashboard show."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from jobcar.formats import loads_strict
from jobcar.job import DEFAULT_CONTENT_TYPE, Job, Progress
from jobcar.timestamps import rfc3339_ms


def job_document(
    job: Job, lease_deadline_ms: int | None = None, waiting_for: Sequence[str] = (), dependents: Sequence[str] = ()
) -> dict[str, Any]:
    """A job as JSON, the same from `jobcar jobs show --json`, `GET /v1/jobs/{id}` and the dashboard.

    The attempt's lease token is not shown: it is the fence of the attempt's writes. Times are RFC 3339 in UTC.
    The payload is the JSON value itself when it is stored as JSON (null when a job kept only by its keep_for
    dropped it), else `payload_base64`; the result (kept for `result_ttl`) is text when it is UTF-8, else
    `result_base64`.
    """
    document: dict[str, Any] = {
        "id": job.id, "queue": job.queue, "type": job.type, "state": job.state.value, "attempt": job.attempt,
        "max_attempts": job.max_attempts, "created_at": rfc3339_ms(job.created_ms), "run_at": rfc3339_ms(job.run_at_ms),
        "started_at": rfc3339_ms(job.started_ms), "finished_at": rfc3339_ms(job.finished_ms),
        "lease_expires_at": rfc3339_ms(lease_deadline_ms),
        "cancel_requested": job.cancel_requested,
        "timeout_seconds": None if job.timeout_ms is None else job.timeout_ms / 1000,
        "backoff_seconds": None if job.backoff_ms is None else job.backoff_ms / 1000,
        "content_type": job.content_type, "unique_key": job.unique_key, "traceparent": job.traceparent,
        "unique_mode": None if job.unique_key is None else ("window" if job.unique_window else "until_done"),
        "batch": job.batch, "meta": job.meta, "priority": job.priority,
        "expires_at": rfc3339_ms(job.expires_at_ms), "debounce_key": job.debounce_key,
        "schedule": job.schedule, "scheduled_at": rfc3339_ms(job.scheduled_at_ms),
        "key": job.limit_key, "held_for": job.held_for,
        "held_since": rfc3339_ms(job.held_at_ms) if job.held_for else None, "after": list(job.after),
        "on_dependency_failure": job.on_dependency_failure or ("fail" if job.after else None),
        "waiting_for": list(waiting_for), "dependents": list(dependents), "parent": job.parent,
        "progress": progress_document(job.progress),
        "errors": [{"attempt": e.attempt, "at": rfc3339_ms(e.at_ms), "error": e.error} for e in job.errors],
    }  # fmt: skip
    try:
        if job.content_type.partition(";")[0].strip().lower() != DEFAULT_CONTENT_TYPE:
            raise ValueError("not JSON")
        # No JSON payload is empty: a finished job kept only by its keep_for has dropped its payload (ack.lua).
        document["payload"] = loads_strict(job.payload) if job.payload else None
    except (ValueError, RecursionError):  # also UnicodeDecodeError: bytes that are not even text
        document["payload_base64"] = base64.b64encode(job.payload).decode("ascii")
    if job.result_dropped is not None:
        document["result_dropped"] = job.result_dropped
    if job.result is None:
        document["result"] = None
    else:
        try:
            document["result"] = job.result.decode("utf-8")
        except UnicodeDecodeError:
            document["result_base64"] = base64.b64encode(job.result).decode("ascii")
    return document


def progress_document(progress: Progress | None) -> dict[str, Any] | None:
    """The latest progress a handler reported: percent and message (each null when not given), when, and in
    which attempt."""
    if progress is None:
        return None
    return {"percent": progress.percent, "message": progress.message, "at": rfc3339_ms(progress.at_ms),
            "attempt": progress.attempt}  # fmt: skip
