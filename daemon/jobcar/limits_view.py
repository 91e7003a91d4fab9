"""What the fleet-wide limits hold now, per limit group: jobs running and held, and a rate's next start
(`jobcar limits`, `GET /v1/limits`). Read with SCAN and plain reads, like fsck: an operator's view, not a
hot path."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobcar.keys import QueueKeys
from jobcar.limit_groups import GroupKind, concurrency_group, parse_group
from jobcar.replies import as_text, time_ms
from jobcar.transport import AsyncRedis

#: The kinds of limit key, by the name that follows the queue's prefix: a type's slots, a group's held
#: jobs, a rate group's TAT.
_KINDS = ("slots", "held", "tat")


@dataclass(frozen=True, slots=True)
class LimitGroup:
    queue: str
    #: The group's name (limit_groups.py): a concurrency limit's, a rate's, or a key's waiting for its turn
    #: of a fair type's total.
    group: str
    running: int
    held: int
    #: The limit the rules give the group now: slots, starts per period as "<count>/<period ms>ms", or
    #: "429 hold" (None: the rules no longer limit it).
    limit: str | None
    #: For a rate group: ms until its next start is allowed (0: now).
    next_start_in_ms: int | None

    @property
    def kind(self) -> str:
        """ "rate", "turn" (a key waiting for its turn of a fair type's total) or "concurrency"."""
        return parse_group(self.group).kind.value

    def document(self) -> dict[str, Any]:
        return {"queue": self.queue, "group": self.group, "kind": self.kind, "running": self.running,
                "held": self.held, "limit": self.limit, "next_start_in_ms": self.next_start_in_ms}  # fmt: skip


def rule_limit(group: str, rules: Mapping[str, Mapping[str, Any]]) -> tuple[str | None, float, int]:
    """(the limit as shown, the rate's interval in ms, its burst) for a group under `rules`
    (`config_types.limit_rules`, decoded)."""
    name = parse_group(group)
    key = name.key or ""
    rule = rules.get(name.job_type, {})
    if name.kind is GroupKind.TURN:  # a key's turn of the type's total: its jobs wait for slots of that
        return (f"turns for {rule['total']}" if rule.get("fair") and rule.get("total") else None), 0.0, 1
    if name.kind is GroupKind.RATE:
        rate = rule.get("key_rate" if key else "rate")
        burst = rule.get("key_burst" if key else "burst", 1)
        if rate:
            return f"{rate[0]}/{rate[1]}ms", rate[1] / rate[0], int(burst)
        # A group without a rate that a handler's 429 holds back (limits.on_429): its TAT is the hold's end.
        return ("429 hold" if rule.get("hold") == ("key" if key else "type") else None), 0.0, 1
    slots = rule.get("per_key") if key else rule.get("total")
    return (None if slots is None else str(slots)), 0.0, 1


async def read_limits(
    redis: AsyncRedis, namespace: str, queues: Sequence[str], rules: Mapping[str, Mapping[str, Any]]
) -> list[LimitGroup]:
    """Every limit group with anything running, held or rated, in `queues`, by queue and group."""
    groups: list[LimitGroup] = []
    now = time_ms(await redis.time())
    for queue in queues:
        keys = QueueKeys.of(namespace, queue)
        names: set[str] = set()
        slot_types: set[str] = set()
        async for found in redis.scan_iter(match=keys.all_limit_keys(), count=1000):
            kind, colon, name = as_text(found)[len(keys.prefix) :].partition(":")
            if colon and kind in _KINDS:
                (slot_types if kind == "slots" else names).add(name)
        # One round trip: a group that only runs jobs has no held list or TAT (SCAN would have found them).
        held_groups, types = sorted(names), sorted(slot_types)
        pipe = redis.pipeline(transaction=False)
        for name in held_groups:
            pipe.llen(keys.held(name))
            pipe.get(keys.tat(name))
        for job_type in types:
            pipe.hvals(keys.slots(job_type))
        replies = await pipe.execute(raise_on_error=False)
        held_and_tat = {name: replies[2 * n : 2 * n + 2] for n, name in enumerate(held_groups)}
        running = _slots_taken(zip(types, replies[2 * len(held_groups) :], strict=True), rules)
        for name in sorted(names | running.keys()):
            held, tat = held_and_tat.get(name, (0, None))
            limit, interval, burst = rule_limit(name, rules)
            next_start = None
            if parse_group(name).kind is GroupKind.RATE:
                due = float(as_text(tat)) - interval * (burst - 1) if isinstance(tat, bytes | str) else now
                next_start = max(0, math.ceil(due - now))
            groups.append(LimitGroup(queue, name, running.get(name, 0), held if isinstance(held, int) else 0,
                                     limit, next_start))  # fmt: skip
    return groups


def _slots_taken(slot_hashes: Iterable[tuple[str, Any]], rules: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Slots taken by concurrency group, from (type, HVALS reply of its slot hash: id -> key, "" for none):
    every entry counts in its type's total, one with a key also in that key's group. A type's total shows
    when its rule has one, or a job took its slot without a key."""
    taken: dict[str, int] = {}
    for job_type, values in slot_hashes:
        if not isinstance(values, list):
            continue  # a slot hash of another type: fsck reports it
        by_key = Counter(as_text(value) for value in values)
        if rules.get(job_type, {}).get("total") or "" in by_key:
            taken[job_type] = len(values)
        taken.update((concurrency_group(job_type, key), n) for key, n in by_key.items() if key)
    return taken
