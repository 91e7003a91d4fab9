"""Reads for operators (plain commands: reading never changes state)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jobcar.job import State
from jobcar.keys import QueueKeys, queues_key
from jobcar.replies import as_bytes, as_text, decode_names
from jobcar.transport import SyncRedis


def known_queues(client: SyncRedis, namespace: str) -> list[str]:
    """The queue names producers have registered in `<ns>:queues`, sorted."""
    return decode_names(client.smembers(queues_key(namespace)))


def list_job_ids(client: SyncRedis, keys: QueueKeys, state: State, limit: int) -> list[str]:
    """Up to `limit` ids of the jobs in one of the four sets, in the order they will leave it: pending in
    run order (the daemon pops the right end of the list first), the sorted sets by score (run-at,
    lease deadline, died-at)."""
    if limit <= 0:
        return []
    if state is State.PENDING:
        return [as_text(m) for m in reversed(client.lrange(keys.pending, -limit, -1))]
    sets = {State.SCHEDULED: keys.scheduled, State.ACTIVE: keys.active, State.DEAD: keys.dead}
    if state not in sets:
        raise ValueError(f"jobs in state {state.value} are in no set")
    return [as_text(m) for m in client.zrange(sets[state], 0, limit - 1)]


def job_hashes(client: SyncRedis, keys: QueueKeys, job_ids: Sequence[str]) -> list[dict[bytes, bytes]]:
    """The hashes of these jobs in one round trip, in order; an empty dict for a job that is gone."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job(job_id))
    return [{as_bytes(k): as_bytes(v) for k, v in reply.items()} for reply in pipe.execute()]


def find_job(client: SyncRedis, namespace: str, job_id: str, queues: Iterable[str]) -> dict[str, str]:
    """queue -> the job's state, for each of `queues` that holds a job with this id (ids are unique
    within a queue only, so there may be several), in the order of `queues`."""
    names = list(dict.fromkeys(queues))
    pipe = client.pipeline(transaction=False)
    for queue in names:
        pipe.hget(QueueKeys.of(namespace, queue).job(job_id), "state")
    return {queue: as_text(state) for queue, state in zip(names, pipe.execute(), strict=True) if state is not None}
