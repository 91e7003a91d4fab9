"""RFC 3339 timestamps in UTC with milliseconds (`2024-05-01T12:00:00.123Z`): the one form of every time
jobcar shows, in handler headers, logs, the CLI and the HTTP API. Standard library only."""

from __future__ import annotations

import time
from functools import lru_cache


def rfc3339(epoch_seconds: float) -> str:
    """`epoch_seconds` as `2024-05-01T12:00:00.123Z`."""
    whole_ms = round(epoch_seconds * 1000)  # exact for the ms values jobs carry (created_ms / 1000)
    second, millis = divmod(whole_ms, 1000)
    return f"{_utc_second(second)}.{millis:03d}Z"


def rfc3339_ms(epoch_ms: int | float | None) -> str | None:
    """A stored millisecond time (Redis's clock) as RFC 3339; None stays None."""
    return None if epoch_ms is None else rfc3339(epoch_ms / 1000)


@lru_cache(maxsize=256)
def _utc_second(second: int) -> str:
    # Two timestamps per job (enqueued-at and deadline), mostly in a few recent seconds: formatting the
    # date once per second takes this off the per-job path.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
