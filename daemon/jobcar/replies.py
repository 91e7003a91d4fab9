"""Decoding Redis replies into Python values and jobcar's types.

Clients are created with decode_responses=False (payloads are bytes), so text arrives as bytes; the
helpers also take str and int, which is what a script's reply holds on some servers and clients.
Standard library only (plus jobcar.job): the producer client uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from jobcar.job import Job
from jobcar.scripts import Reply

#: The counters of a batch hash (`<prefix>batch:<id>`), in the order `parse_batch` returns them.
BATCH_FIELDS: Final = ("total", "done", "dead", "canceled")


def as_list(reply: Reply) -> list[Reply]:
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply from a jobcar script, got {reply!r}")
    return reply


def as_bytes(reply: Reply) -> bytes:
    if isinstance(reply, bytes):
        return reply
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, int):
        return str(reply).encode()
    raise TypeError(f"expected a string reply, got {reply!r}")


def as_text(reply: Reply) -> str:
    return as_bytes(reply).decode("utf-8", "replace")


def as_int(reply: Reply) -> int:
    if isinstance(reply, int):
        return reply
    return int(as_bytes(reply))


def time_ms(reply: Sequence[Any]) -> int:
    """A TIME reply (seconds, microseconds; as redis-py parses it, or raw) in milliseconds: Redis time, the clock
    every stored time is on."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def parse_job(job_id: str, queue: str, fields: Mapping[Any, Any]) -> Job:
    """A Job from an HGETALL reply."""
    return Job.from_hash(job_id, queue, {as_bytes(k): as_bytes(v) for k, v in fields.items()})


def decode_names(members: Iterable[Any]) -> list[str]:
    """Sorted text of a SMEMBERS reply (the known queues)."""
    return sorted(as_text(m) for m in members)


def parse_batch(reply: Reply) -> tuple[int, int, int, int]:
    """(total, done, dead, canceled) from `HMGET <prefix>batch:<id> total done dead canceled`; a counter
    that was never incremented (or a batch hash that is gone) reads as 0."""
    values = [0 if v is None else as_int(v) for v in as_list(reply)]
    if len(values) != len(BATCH_FIELDS):
        raise TypeError(f"expected {len(BATCH_FIELDS)} batch counters, got {reply!r}")
    return values[0], values[1], values[2], values[3]
