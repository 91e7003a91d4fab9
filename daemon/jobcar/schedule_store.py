"""Create, change, pause, resume, trigger, remove and read schedules in Redis, from the clients, the CLI, the
HTTP API and the daemon (which keeps its config's schedules there).

Each operation is written once, as a generator of Redis requests (script calls, or a command on the
namespace's schedule index) that receives their replies; `transport.run_sync` and `transport.run_async`
drive it over a redis-py client of either kind. No operation holds a lock: the scripts it calls are
atomic, and the index (name -> queue) is only a way to find a schedule by its name.
"""

from __future__ import annotations

from collections.abc import Sequence

from jobcar.keys import QueueKeys, queues_key
from jobcar.names import check_name
from jobcar.records import DEFAULT_MAX_PAYLOAD_BYTES
from jobcar.replies import as_int, as_list, as_text
from jobcar.schedules import (
    ScheduleSpec,
    ScheduleState,
    due_call,
    index_key,
    parse_due,
    parse_fire,
    parse_state,
    set_call,
    state_call,
    trigger_call,
)
from jobcar.scripts import Reply
from jobcar.transport import Operation, run_call


def _redis_now(keys: QueueKeys) -> Operation[int]:
    """Redis time on the node that holds the queue, where the schedule's scripts will compare with it."""
    return parse_due((yield from run_call(due_call(keys, 0)))).now_ms


def _queue_of(namespace: str, name: str) -> Operation[str | None]:
    check_name("schedule name", name)
    queue = yield ("HGET", index_key(namespace), name)
    return None if queue is None else as_text(queue)


def upsert(namespace: str, spec: ScheduleSpec, origin: str) -> Operation[str]:
    """Create or change a schedule: "created", "changed" or "unchanged". A schedule moved to another queue
    leaves the old one first."""
    keys = QueueKeys.of(namespace, spec.queue)
    old = yield from _queue_of(namespace, spec.name)
    if old is not None and old != spec.queue:
        yield from run_call(state_call(QueueKeys.of(namespace, old), spec.name, "remove"))
    now = yield from _redis_now(keys)
    result = as_text((yield from run_call(set_call(keys, spec, origin, spec.next_tick(now)))))
    yield ("HSET", index_key(namespace), spec.name, spec.queue)
    yield ("SADD", queues_key(namespace), spec.queue)  # where operators' tools look for jobs, as enqueue does
    return result


def get(namespace: str, name: str) -> Operation[ScheduleState | None]:
    queue = yield from _queue_of(namespace, name)
    if queue is None:
        return None
    fields = yield ("HGETALL", QueueKeys.of(namespace, queue).schedule(name))
    return parse_state(_as_bytes_map(fields))


def every_schedule(namespace: str) -> Operation[list[ScheduleState]]:
    index = yield ("HGETALL", index_key(namespace))
    found = []
    for name, queue in sorted(_as_bytes_map(index).items()):
        fields = yield ("HGETALL", QueueKeys.of(namespace, as_text(queue)).schedule(as_text(name)))
        state = parse_state(_as_bytes_map(fields))
        if state is not None:
            found.append(state)
    return found


def change(namespace: str, name: str, action: str) -> Operation[int]:
    """pause, resume or remove: 1 changed, 0 already so, -1 no such schedule."""
    queue = yield from _queue_of(namespace, name)
    if queue is None:
        return -1
    keys = QueueKeys.of(namespace, queue)
    next_ms = None
    if action == "resume":
        state = parse_state(_as_bytes_map((yield ("HGETALL", keys.schedule(name)))))
        if state is None:
            return -1
        next_ms = state.spec.next_tick((yield from _redis_now(keys)))
    result = as_int((yield from run_call(state_call(keys, name, action, next_ms))))
    if action == "remove":
        yield ("HDEL", index_key(namespace), name)
    return result


def trigger(namespace: str, name: str, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Operation[str | None]:
    """One job of the schedule now, its ticks unmoved: the job's id, or None for no such schedule."""
    state = yield from get(namespace, name)
    if state is None:
        return None
    keys = QueueKeys.of(namespace, state.spec.queue)
    fired = parse_fire((yield from run_call(trigger_call(keys, state.spec, max_payload_bytes))))
    return fired.job_id if fired.outcome == "triggered" else None


def sync_config(namespace: str, specs: Sequence[ScheduleSpec]) -> Operation[dict[str, str]]:
    """Make Redis hold exactly the config's schedules among those the config made (origin `config`):
    each is created or changed, and one the config no longer names is removed. name -> what happened."""
    done = {}
    for spec in specs:
        done[spec.name] = yield from upsert(namespace, spec, "config")
    names = {spec.name for spec in specs}
    for state in (yield from every_schedule(namespace)):
        if state.origin == "config" and state.spec.name not in names:
            yield from change(namespace, state.spec.name, "remove")
            done[state.spec.name] = "removed"
    return done


def _as_bytes_map(reply: Reply) -> dict[bytes, bytes]:
    if not reply:
        return {}
    if isinstance(reply, dict):
        return {_b(k): _b(v) for k, v in reply.items()}
    items = as_list(reply)  # RESP2 without a response callback: a flat list
    return {_b(items[i]): _b(items[i + 1]) for i in range(0, len(items), 2)}


def _b(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
