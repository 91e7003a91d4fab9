"""`stats_document`: a queue's stats as JSON, the one form `jobcar stats --json` and `GET /v1/stats` show."""

from __future__ import annotations

from typing import Any, Final

from jobcar.history_calls import QueueHistory
from jobcar.transitions import QueueStats

#: The windows of the stats document's counts of processed attempts.
MINUTE_MS: Final = 60_000
HOUR_MS: Final = 3_600_000


def stats_document(stats: QueueStats, history: QueueHistory) -> dict[str, Any]:
    """One queue's stats as JSON: the one definition of `jobcar stats --json` and `GET /v1/stats`. processed: the
    attempts that ended (done or failed), fleet-wide, over the last minute and hour of Redis time.
    max_pending_by_type: each type with a bound, its jobs pending or held and the bound (`{}`: none)."""
    minute, hour = history.totals(MINUTE_MS), history.totals(HOUR_MS)
    return {
        "queue": stats.queue, "pending": stats.pending, "scheduled": stats.scheduled, "active": stats.active,
        "held": stats.held, "waiting": stats.waiting, "dead": stats.dead, "paused": stats.paused,
        "latency_seconds": stats.latency_s,
        "processed_last_minute": minute["done"] + minute["failed"], "failed_last_minute": minute["failed"],
        "processed_last_hour": hour["done"] + hour["failed"], "failed_last_hour": hour["failed"],
        "max_pending": stats.max_pending, "refused": stats.refused,
        "max_pending_by_type": {
            job_type: {"count": stats.pending_counts.get(job_type, 0), "max_pending": bound}
            for job_type, bound in sorted(stats.max_pending_by_type.items())
        },
    }  # fmt: skip
