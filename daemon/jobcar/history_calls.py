"""The fleet-wide history of finished attempts (lua/count.lua, lua/history.lua): the call that adds a daemon's
counts, the call that reads a queue's last hours, and what it reads (`QueueHistory`). history.py counts; `jobcar
stats`, the dashboard and GET /v1/stats read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from jobcar.keys import QueueKeys
from jobcar.replies import as_int, as_list, as_text
from jobcar.scripts import Arg, Reply, ScriptCall, call

#: What the history counts, per job type: attempts that succeeded, attempts that failed (retried or
#: dead), and jobs that died.
HISTORY_OUTCOMES: Final = ("done", "failed", "dead")
#: The history's resolution: counts are kept per slot of this many ms of Redis time.
HISTORY_SLOT_MS: Final = 10_000


def count_call(keys: QueueKeys, counts: Mapping[tuple[str, str], int]) -> ScriptCall:
    """Add (type, outcome) -> count to the queue's history."""
    args: list[Arg] = [keys.prefix]
    for (job_type, outcome), n in counts.items():
        args += [f"{job_type}|{outcome}", n]
    return call("count", (keys.history,), args)


@dataclass(frozen=True, slots=True)
class QueueHistory:
    queue: str
    now_ms: int
    #: (slot start ms, job type, outcome) -> count, over the current hour and the one before.
    counts: dict[tuple[int, str, str], int]

    def totals(self, window_ms: int, job_type: str | None = None) -> dict[str, int]:
        """outcome -> count over the last `window_ms` (whole slots), of one type or of all."""
        totals = dict.fromkeys(HISTORY_OUTCOMES, 0)
        for kind, counts in self.by_type(window_ms).items():
            if job_type is None or kind == job_type:
                for outcome, n in counts.items():
                    totals[outcome] += n
        return totals

    def by_type(self, window_ms: int) -> dict[str, dict[str, int]]:
        """job type -> outcome -> count over the last `window_ms` (whole slots), in one pass over the counts."""
        since = self.now_ms - window_ms
        found: dict[str, dict[str, int]] = {}
        for (slot_ms, kind, outcome), n in self.counts.items():
            if slot_ms + HISTORY_SLOT_MS > since and outcome in HISTORY_OUTCOMES:
                found.setdefault(kind, dict.fromkeys(HISTORY_OUTCOMES, 0))[outcome] += n
        return found


def history_call(keys: QueueKeys) -> ScriptCall:
    return call("history", (keys.history,), (keys.prefix,))


def parse_history(keys: QueueKeys, reply: Reply) -> QueueHistory:
    now, *hours = as_list(reply)
    counts: dict[tuple[int, str, str], int] = {}
    for flat in hours:
        items = as_list(flat)
        for field_name, value in zip(items[::2], items[1::2], strict=True):
            slot, job_type, outcome = as_text(field_name).split("|", 2)
            counts[(int(slot) * HISTORY_SLOT_MS, job_type, outcome)] = as_int(value)
    return QueueHistory(keys.queue, as_int(now), counts)
