"""The wire format of batched delivery (docs/batching.md): the jobs of one batch as JSON
objects, and the handler's answers back to one Outcome per job. Pure: no I/O.

A job goes out as `{"id", "type", "queue", "attempt", "max_attempts", "enqueued_at", "content_type",
"payload" | "payload_base64", "meta"?, "key"?, "attempt_url"?, "attempt_token"?, ...}`; an answer comes back
as `{"id", "outcome": "done" | "retry" | "fail" | "snooze", "error"?, "retry_after"?, "delay"?, "result"?}`
("snooze": come back after `delay` seconds without spending an attempt, as the handler API's snooze). A job
without a well-formed answer of its own has failed (a retry that spends its attempt): a missing or malformed
answer is never a success.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from jobcar.attempt_desk import TOKEN_FIELD, URL_FIELD, LiveAttempt
from jobcar.job import DEFAULT_CONTENT_TYPE, Job
from jobcar.outcome import Outcome
from jobcar.timestamps import rfc3339, rfc3339_ms

__all__ = ["command_input", "http_body", "outcomes_from_array", "outcomes_from_lines"]

_OUTCOMES: Final = ("done", "retry", "fail", "snooze")
_DONE: Final = Outcome.success()  # frozen: one for every job answered done without a result
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


#: A JSON string literal (C code; quotes and escapes `"`, `\\` and control characters, keeps other text as is).
_string: Final[Callable[[str], str]] = json.encoder.encode_basestring


def _item(job: Job, max_attempts: int, attempt: LiveAttempt | None, *, one_line: bool) -> bytes:
    """One job as a JSON object. Built as text rather than as a dict to encode: this runs for every job of
    every batch, and a JSON payload is spliced in as its producer wrote it (after a check that it parses)."""
    head = (
        f'{{"id":{_string(job.id)},"type":{_string(job.type)},"queue":{_string(job.queue)},'
        f'"attempt":{job.attempt},"max_attempts":{max_attempts},'
        f'"enqueued_at":"{rfc3339(job.created_ms / 1000)}","content_type":{_string(job.content_type)}'
    )
    if job.meta:
        head += ',"meta":' + _encode(job.meta)
    if job.limit_key is not None:
        head += ',"key":' + _string(job.limit_key)
    if job.traceparent:
        head += ',"traceparent":' + _string(job.traceparent)
    if job.scheduled_at_ms is not None:
        head += f',"schedule":{_string(job.schedule or "")},"scheduled_at":"{rfc3339_ms(job.scheduled_at_ms)}"'
    if job.after:
        head += ',"after":' + _encode(list(job.after))
    if attempt is not None:
        head += f',"{URL_FIELD}":{_string(attempt.url)},"{TOKEN_FIELD}":"{attempt.token}"'
    return head.encode() + _payload(job, one_line=one_line) + b"}"


def _payload(job: Job, *, one_line: bool) -> bytes:
    """`,"payload":<the JSON payload>`, or `,"payload_base64":"..."` for any other payload, and for one that a
    strict parser would refuse (not UTF-8, a BOM, NaN or Infinity, a lone surrogate): one job must not make
    the whole batch's body invalid. On one line (a command's input), a payload that spans lines is
    re-encoded without its line breaks."""
    if job.content_type == DEFAULT_CONTENT_TYPE:
        with contextlib.suppress(ValueError):  # UnicodeError is a ValueError
            value = json.loads(job.payload.decode(), parse_constant=_refuse_constant)
            spans_lines = one_line and (b"\n" in job.payload or b"\r" in job.payload)
            if spans_lines or _SURROGATE_ESCAPE.search(job.payload):
                # Re-encoded compact; paired surrogates become the character they stand for, and a lone one
                # cannot be encoded (UnicodeEncodeError: base64 below).
                return b',"payload":' + _encode(value).encode()
            return b',"payload":' + job.payload
    return b',"payload_base64":"' + base64.b64encode(job.payload) + b'"'


#: `\uD800` to `\uDFFF`: surrogates, which strict parsers refuse unpaired.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def http_body(jobs: Sequence[Job], max_attempts: Sequence[int], attempts: Sequence[LiveAttempt] = ()) -> bytes:
    """A batch as one HTTP request body: a JSON array of the jobs."""
    items = [_item(job, most, attempt, one_line=False) for job, most, attempt in _each(jobs, max_attempts, attempts)]
    return b"[" + b",".join(items) + b"]"


def command_input(jobs: Sequence[Job], max_attempts: Sequence[int], attempts: Sequence[LiveAttempt] = ()) -> bytes:
    """A batch as a command's stdin: one JSON object per line."""
    each = _each(jobs, max_attempts, attempts)
    return b"".join(_item(job, most, attempt, one_line=True) + b"\n" for job, most, attempt in each)


def _each(
    jobs: Sequence[Job], max_attempts: Sequence[int], attempts: Sequence[LiveAttempt]
) -> zip[tuple[Job, int, LiveAttempt | None]]:
    each: Sequence[LiveAttempt | None] = attempts or [None] * len(jobs)
    return zip(jobs, max_attempts, each, strict=True)


def outcomes_from_array(
    jobs: Sequence[Job], body: bytes, *, result_limit: int, max_retry_after: float
) -> list[Outcome]:
    """Each job's Outcome from an HTTP answer: a JSON array of answers. A body that is not one fails every job."""
    try:
        answers = json.loads(body)
    except ValueError as exc:
        return [Outcome.retry(f"batch answer: the response body is not JSON ({exc})")] * len(jobs)
    if not isinstance(answers, list):
        return [Outcome.retry("batch answer: the response body is not a JSON array")] * len(jobs)
    found = _outcomes(jobs, answers, result_limit=result_limit, max_retry_after=max_retry_after)
    missing = Outcome.retry("batch answer: the response has no answer for this job")
    return [outcome or missing for outcome in found]


def outcomes_from_lines(
    jobs: Sequence[Job], stdout: bytes, *, result_limit: int, max_retry_after: float
) -> list[Outcome | None]:
    """Each job's Outcome from a command's stdout, one JSON answer per line, None where a job has no line.
    Lines that are not JSON objects are the handler's own output, not answers: they are skipped."""
    answers = []
    for line in stdout.splitlines():
        try:
            answers.append(json.loads(line))
        except ValueError:
            continue
    return _outcomes(jobs, [a for a in answers if isinstance(a, dict)], result_limit=result_limit,
                     max_retry_after=max_retry_after)  # fmt: skip


def _outcomes(
    jobs: Sequence[Job], answers: Iterable[object], *, result_limit: int, max_retry_after: float
) -> list[Outcome | None]:
    position = {job.id: i for i, job in enumerate(jobs)}
    found: list[Outcome | None] = [None] * len(jobs)
    answered: set[str] = set()
    for answer in answers:
        job_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(answer, dict) or not isinstance(job_id, str) or job_id not in position:
            continue  # not about a job of this batch: nothing to attribute it to
        i = position[job_id]
        if job_id in answered:
            found[i] = Outcome.retry("batch answer: the handler answered more than once for this job")
            continue
        answered.add(job_id)
        found[i] = _outcome(answer, result_limit=result_limit, max_retry_after=max_retry_after)
    return found


def _outcome(answer: dict[str, Any], *, result_limit: int, max_retry_after: float) -> Outcome:
    kind = answer.get("outcome")
    error = answer.get("error")
    if kind not in _OUTCOMES:
        return Outcome.retry(f"batch answer: outcome must be one of done, retry, fail, not {_shown(kind)}")
    if error is not None and not isinstance(error, str):
        return Outcome.retry(f"batch answer: error must be a string, not {_shown(error)}")
    if kind == "done":
        if "result" not in answer:
            return _DONE
        return Outcome.success(_encode(answer["result"]).encode()[:result_limit])
    if kind == "fail":
        return Outcome.fail(error or "the handler's batch answer says fail")
    if kind == "snooze":
        delay = answer.get("delay")
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
            return Outcome.retry(f"batch answer: a snooze's delay must be a number of seconds, not {_shown(delay)}")
        return Outcome.snooze(min(float(delay), max_retry_after))
    after = answer.get("retry_after")
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, int | float) or not math.isfinite(after) or after < 0:
            return Outcome.retry(f"batch answer: retry_after must be a number of seconds, not {_shown(after)}")
        after = min(float(after), max_retry_after)
    return Outcome.retry(error or "the handler's batch answer says retry", after=after)


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:59] + "…"
