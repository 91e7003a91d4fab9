"""What running one job against its handler came to. Executors return it; the runner acts on it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

#: last_error is stored in Redis and shown by the CLI: keep it short enough to read and to store.
MAX_ERROR_CHARS: Final = 2000


class OutcomeKind(StrEnum):
    SUCCESS = "success"
    RETRY = "retry"
    FAIL = "fail"  # permanent: straight to the dead-letter queue


def bound_error(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Keep the end of an error text (the end of stderr or a traceback says the most)."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    error: str | None = None
    #: Seconds the handler asked to wait (Retry-After); None lets the backoff policy decide.
    retry_after: float | None = None
    #: False when the handler only asked for a later slot (429/503 + Retry-After): no attempt is spent.
    spend_attempt: bool = True
    result: bytes | None = None
    #: The handler answered 429 with a valid Retry-After: too busy, which `limits.on_429` may apply to the
    #: job's whole type or key.
    busy: bool = False

    @classmethod
    def success(cls, result: bytes | None = None) -> Outcome:
        return cls(OutcomeKind.SUCCESS, result=result)

    @classmethod
    def retry(
        cls, error: str, *, after: float | None = None, spend_attempt: bool = True, busy: bool = False
    ) -> Outcome:
        return cls(OutcomeKind.RETRY, error=bound_error(error), retry_after=after, spend_attempt=spend_attempt,
                   busy=busy)  # fmt: skip

    @classmethod
    def snooze(cls, delay: float) -> Outcome:
        """The handler's snooze: come back in `delay` seconds without spending an attempt (while the job has
        snoozes left: its handler's `max_snoozes`)."""
        return cls.retry(f"snoozed by its handler for {delay:g}s", after=delay, spend_attempt=False)

    @classmethod
    def fail(cls, error: str) -> Outcome:
        return cls(OutcomeKind.FAIL, error=bound_error(error))
