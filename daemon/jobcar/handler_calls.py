"""The writes of the handler API (handler_api.py) as script calls, and what their replies say; no I/O.

Each is fenced by the attempt's lease, as the attempt's own outcome is: a handler whose lease was lost, or
whose job an operator canceled, writes nothing (lua/includes/attempt_refusal.lua).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from jobcar.keys import QueueKeys
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import Reply, ScriptCall, call

#: How an accepted write replies (any other text says why it was refused).
ACCEPTED: Final = "ok"

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def now_ms() -> int:
    return int(time.time() * 1000)


def progress_document(attempt: int, percent: float | None, message: str | None) -> str:
    """The job's `progress` field: the latest a handler reported, with when and in which attempt."""
    document: dict[str, object] = {"at": now_ms(), "attempt": attempt}
    if percent is not None:
        document["percent"] = percent
    if message is not None:
        document["message"] = message
    return _encode(document)


def log_entry(attempt: int, line: str, at_ms: int) -> str:
    """One entry of a job's log (`QueueKeys.log`)."""
    return _encode({"at": at_ms, "attempt": attempt, "line": line})


def step_value(result: bytes, at_ms: int) -> bytes:
    """A durable step as stored: "<ms> <result>" (`QueueKeys.steps`)."""
    return b"%d " % at_ms + result


def split_step_value(stored: bytes) -> tuple[int, bytes]:
    """(written at ms, result) of a stored step."""
    at, _, result = stored.partition(b" ")
    return int(at), result


def progress_call(keys: QueueKeys, job_id: str, lease_token: str, document: str) -> ScriptCall:
    return call("progress", (keys.job(job_id),), (lease_token, document))


def log_call(
    keys: QueueKeys, job_id: str, lease_token: str, entries: Sequence[str], max_lines: int, max_bytes: int
) -> ScriptCall:
    return call("log", (keys.job(job_id), keys.log(job_id)), (lease_token, max_lines, max_bytes, *entries))


def step_call(keys: QueueKeys, job_id: str, lease_token: str, name: str, value: bytes, max_steps: int) -> ScriptCall:
    return call("step", (keys.job(job_id), keys.steps(job_id)), (lease_token, name, value, max_steps))


def adopt_call(
    keys: QueueKeys, job_id: str, lease_token: str, child_refs: Sequence[str], max_children: int
) -> ScriptCall:
    return call("adopt", (keys.job(job_id), keys.children(job_id)), (lease_token, max_children, *child_refs))


def await_children_call(
    keys: QueueKeys, job_id: str, lease_token: str, on_child_failure: str, continuations: Sequence[str] = ()
) -> ScriptCall:
    """The job waits for its children but `continuations` (references of children that wait for it)."""
    return call(
        "await_children",
        (keys.active, keys.waiting, keys.job(job_id), keys.children(job_id)),
        (keys.prefix, job_id, lease_token, on_child_failure, *continuations),
    )


@dataclass(frozen=True, slots=True)
class LogReply:
    """What a log write did: refused (with why), or kept with this many lines and dropped this many in all."""

    refusal: str | None
    lines: int = 0
    dropped: int = 0


def parse_log(reply: Reply) -> LogReply:
    items = as_list(reply)
    status = as_text(items[0])
    if status != ACCEPTED:
        return LogReply(status)
    return LogReply(None, as_int(items[1]), as_int(items[2]))


def parse_await(reply: Reply) -> tuple[str | None, list[str]]:
    """(why it was refused, or None; the children's references to register with)."""
    items = [as_text(item) for item in as_list(reply)]
    if items[0] != "waiting":
        return items[0], []
    return None, items[1:]
