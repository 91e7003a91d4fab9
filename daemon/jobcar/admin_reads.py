"""What operators read of the store, for every surface (the CLI, the HTTP API, the dashboard): queues,
stats, a state's jobs by position, limits, one job and its log, a wait for its outcome. Plain commands only:
reading never changes state.

A job id is unique within a queue only: `locate` finds it by one rule (the queue given, else every queue
the config names or producers used) and says so when several queues hold it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from jobcar.errors import JobcarError
from jobcar.history_calls import QueueHistory, history_call, parse_history
from jobcar.job import FINISHED, Job, State
from jobcar.job_view import JobView, LogRead, log_entry, state_or_none, with_handler_data
from jobcar.keys import QueueKeys, queues_key, waiter_ttl_ms
from jobcar.limits_view import LimitGroup, read_limits
from jobcar.replies import as_bytes, as_int, as_list, as_text, decode_names, parse_job, time_ms
from jobcar.scripts import call
from jobcar.transitions import (
    QueueStats,
    job_fields_call,
    parse_job_fields,
    parse_stats,
    stats_call,
)
from jobcar.transport import AsyncRedis, execute_async

#: A wait for a job's outcome reads it this often: from every 10 ms at first to every 250 ms.
WAIT_POLL_MIN, WAIT_POLL_MAX = 0.01, 0.25


class JobNotFound(JobcarError):
    """No job with this id (in the queue given, or in any queue)."""


class AmbiguousJob(JobcarError):
    """Several queues hold a job with this id: the caller must name the queue."""

    def __init__(self, job_id: str, found: dict[str, State]) -> None:
        where = ", ".join(f"{queue} ({state.value})" for queue, state in found.items())
        super().__init__(f"there are jobs with id {job_id} in several queues: {where}")
        self.found = found


class AdminReads:
    """Reads of one namespace. `configured` are the config's queues, in its order: they come first when
    every queue is meant."""

    def __init__(self, client: AsyncRedis, namespace: str, configured: Iterable[str] = ()) -> None:
        self.redis = client
        self.namespace = namespace
        self.configured = list(configured)

    def keys(self, queue: str) -> QueueKeys:
        return QueueKeys.of(self.namespace, queue)

    async def known_queues(self) -> list[str]:
        """The queue names producers have registered in `<ns>:queues`, sorted."""
        return decode_names(await self.redis.smembers(queues_key(self.namespace)))

    async def queues(self, only: str | None = None) -> list[str]:
        """`only`, else the config's queues in its order, then every other queue producers have used."""
        if only is not None:
            return [only]
        return list(dict.fromkeys([*self.configured, *await self.known_queues()]))

    async def limits(self, rules: Mapping[str, Mapping[str, Any]], only: str | None = None) -> list[LimitGroup]:
        """Every limit group with a job running, held or rated, in `only` or every queue (`queues`), under the
        config's rules (`config_types.limit_rule_table`)."""
        return await read_limits(self.redis, self.namespace, await self.queues(only), rules)

    async def locate(self, job_id: str, queue: str | None = None) -> tuple[str, State]:
        """(queue, state) of the job with this id, in `queue` or in any queue; JobNotFound or AmbiguousJob."""
        found = (await self._states([job_id], await self.queues(queue)))[job_id]
        if not found:
            raise JobNotFound(f"no such job {job_id}" + (f" in queue {queue}" if queue else ""))
        if len(found) > 1:
            raise AmbiguousJob(job_id, found)
        return next(iter(found.items()))

    async def stats(self, queues: Sequence[str]) -> list[QueueStats]:
        keys = [self.keys(queue) for queue in queues]
        replies = await execute_async(self.redis, [stats_call(k) for k in keys])
        return [parse_stats(k, reply) for k, reply in zip(keys, replies, strict=True)]

    async def history(self, queues: Sequence[str]) -> list[QueueHistory]:
        """Each queue's fleet-wide counts of finished attempts over the last hour or two (history.py)."""
        keys = [self.keys(queue) for queue in queues]
        replies = await execute_async(self.redis, [history_call(k) for k in keys])
        return [parse_history(k, reply) for k, reply in zip(keys, replies, strict=True)]

    async def job(self, job_id: str, queue: str | None = None) -> JobView:
        """The job with this id (found by `locate` when no queue is given); JobNotFound also when its hash
        cannot be read."""
        gone = f"no such job {job_id} in queue {queue}"
        if queue is None:
            queue, _ = await self.locate(job_id)
            gone = f"no such job {job_id} (it finished just now)"
        keys = self.keys(queue)
        # A cluster's pipelines refuse TIME (it names no key): asked of the job's node apart.
        cluster = isinstance(self.redis, AsyncRedisCluster)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.job(job_id))
        pipe.zscore(keys.active, job_id)
        if not cluster:
            pipe.time()
        pipe.smembers(keys.deps(job_id))
        pipe.smembers(keys.dependents(job_id))
        # The sets' replies may be refusals (a key of another type reads as none); the job's own may not.
        replies = await pipe.execute(raise_on_error=False)
        if cluster:
            replies.insert(2, await self._node_time(keys))
        fields, deadline, now, deps, dependents = replies
        for reply in (fields, deadline):
            if isinstance(reply, Exception):
                raise reply
        if not fields:
            raise JobNotFound(gone)
        job = readable(job_id, queue, fields)
        if isinstance(job, str):
            raise JobNotFound(job)
        lease_deadline_ms = None if deadline is None or job.state is not State.ACTIVE else int(deadline)
        view = JobView(job, lease_deadline_ms, time_ms(now), _refs(deps), _refs(dependents))
        # Only a job whose handlers wrote through the handler API has keys beside its hash (`handler_data`).
        if not fields.get(b"handler_data"):
            return view
        return await with_handler_data(self.redis, self.namespace, view, fields)

    async def log_since(self, job_id: str, queue: str, index: int = 0, last: int | None = None) -> LogRead:
        """The lines of the job's log from `index` on (counting every line ever written to it, dropped ones
        too), or its `last` lines, with the job's state: in one script, as the log's bounds drop its oldest
        lines while it is read."""
        keys = self.keys(queue)
        args = ("", last) if last is not None else (max(0, index), "")
        read = call("log_read", (keys.job(job_id), keys.log(job_id)), args)
        state, _, first, raw = as_list((await execute_async(self.redis, [read]))[0])
        entries = tuple(log_entry(item) for item in as_list(raw))
        start = as_int(first)
        missed = 0 if last is not None else max(0, start - index)
        return LogRead(state_or_none(state), missed, entries, start + len(entries))

    async def wait(self, job_id: str, queue: str | None, seconds: float) -> JobView:
        """The job once it has finished (done or dead), or as it is after `seconds`; JobNotFound when
        it is gone meanwhile (it succeeded without a kept result, or it was canceled)."""
        queue, _ = await self.locate(job_id, queue)  # once: each look after it reads the job's own keys
        # The job's ack keeps it a while for this wait, even without a kept result (ack.lua).
        await self.redis.set(self.keys(queue).waiter(job_id), "1", px=waiter_ttl_ms(seconds))
        deadline = time.monotonic() + seconds
        pause = WAIT_POLL_MIN
        while True:
            view = await self.job(job_id, queue)
            left = deadline - time.monotonic()
            if view.job.state in FINISHED or left <= 0:
                return view
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, WAIT_POLL_MAX)

    async def _states(self, job_ids: Sequence[str], queues: Sequence[str]) -> dict[str, dict[str, State]]:
        """job id -> {queue: its state} for each of `queues` holding a job with that id, in one round trip."""
        names = list(dict.fromkeys(queues))
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            for queue in names:
                pipe.hget(self.keys(queue).job(job_id), "state")
        replies = iter(await pipe.execute())
        return {
            job_id: {queue: State(as_text(s)) for queue in names if (s := next(replies)) is not None}
            for job_id in job_ids
        }

    async def ids(self, queue: str, state: State, start: int, count: int, newest_first: bool = False) -> list[str]:
        """Ids `start` to `start + count` of a state's set or lists (not `done`: no set holds those), in the order
        they leave it, or the other way round."""
        return [job_id for job_id, _ in await self.located(queue, state, start, count, newest_first)]

    async def located(
        self, queue: str, state: State, start: int, count: int, newest_first: bool = False
    ) -> list[tuple[str, int]]:
        """As `ids`, each with its index in its list counted from the left (the newest) end, as read (a hint:
        the list may have changed since); -1 for the sorted sets' jobs."""
        keys = self.keys(queue)
        if count <= 0:
            return []
        if state is State.PENDING:
            # In lease order: the jobs a limit let go, then by priority; `newest_first`, the other way round.
            lists = keys.lease_order[::-1] if newest_first else keys.lease_order
            pipe = self.redis.pipeline(transaction=False)
            for key in lists:
                pipe.llen(key)
            # A list of another type (fsck reports it) counts as empty.
            lengths = [n if isinstance(n, int) else 0 for n in await pipe.execute(raise_on_error=False)]
            return await self._in_lists(list(zip(lists, lengths, strict=True)), start, count, newest_first)
        if state is State.HELD:
            # Group by group (by name), each group's in the order its slots let them go.
            groups = [(keys.held(group), n) for group, n in await self.held_groups(queue)]
            return await self._in_lists(groups, start, count, newest_first)
        sets = {
            State.SCHEDULED: keys.scheduled,
            State.ACTIVE: keys.active,
            State.DEAD: keys.dead,
            State.WAITING: keys.waiting,
        }
        members = await self.redis.zrange(sets[state], start, start + count - 1, desc=newest_first)
        return [(as_text(m), -1) for m in members]

    async def _in_lists(
        self, lists: Sequence[tuple[str, int]], start: int, count: int, newest_first: bool
    ) -> list[tuple[str, int]]:
        """Ids `start` to `start + count` of these lists (key, length) one after the other, each from its right
        (oldest) end, or with `newest_first` from its left end; with their indexes from the left."""
        found: list[tuple[str, int]] = []
        for key, length in lists:
            if start >= length:
                start -= length
                continue
            take = min(count - len(found), length - start)
            if newest_first:  # the left end holds the last enqueued
                members = await self.redis.lrange(key, start, start + take - 1)
                found += [(as_text(m), start + n) for n, m in enumerate(members)]
            else:
                members = await self.redis.lrange(key, -start - take, -start - 1)
                first = length - start - take  # the index of members[0], as the length was read
                found += [(as_text(members[n]), first + n) for n in range(len(members) - 1, -1, -1)]
            start = 0
            if len(found) >= count:
                break
        return found

    async def held_groups(self, queue: str) -> list[tuple[str, int]]:
        """(limit group, jobs it holds) for each group of the queue holding jobs, by group name: the lists of
        `<prefix>limit_groups`, as the stats script counts them (a list of another type counts as empty)."""
        keys = self.keys(queue)
        members = await self.redis.smembers(keys.limit_groups)
        groups = sorted(decode_names(members)) if isinstance(members, set) else []
        if not groups:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for group in groups:
            pipe.llen(keys.held(group))
        lengths = await pipe.execute(raise_on_error=False)
        return [(g, n) for g, n in zip(groups, lengths, strict=True) if isinstance(n, int) and n > 0]

    async def job_keys_page(self, queue: str, cursor: int, count: int, id_prefix: str = "") -> tuple[int, list[str]]:
        """One SCAN step (COUNT `count`) over the queue's job hashes, or those whose id starts with `id_prefix`:
        (the next cursor, 0 when done; the ids found). Done jobs, which no set holds, are found this way."""
        keys = self.keys(queue)
        match = keys.all_jobs(id_prefix)
        if isinstance(self.redis, AsyncRedisCluster):  # the node of the queue's slot holds all its keys
            node = self.redis.get_node_from_key(keys.pending)
            if node is None:
                raise redis_errors.ClusterDownError(f"no node serves the slot of queue {queue}")
            # The cluster client answers a SCAN with each node's cursor (its stubs say an int).
            cursors, found = await self.redis.scan(cursor, match=match, count=count, target_nodes=node)
            cursor = cast(dict[str, int], cursors)[node.name]
        else:
            cursor, found = await self.redis.scan(cursor, match=match, count=count)
        prefix = len(keys.job(""))
        return int(cursor), [as_text(k)[prefix:] for k in found]

    async def _node_time(self, keys: QueueKeys) -> Any:
        """TIME from the node of the queue's slot (a cluster's client sends a command naming no key anywhere)."""
        assert isinstance(self.redis, AsyncRedisCluster)
        node = self.redis.get_node_from_key(keys.pending)
        if node is None:
            raise redis_errors.ClusterDownError(f"no node serves the slot of queue {keys.queue}")
        return await self.redis.time(target_nodes=node)

    async def now_ms(self) -> int:
        """Redis time, the clock every stored time was taken with."""
        return time_ms(await self.redis.time())

    async def jobs(self, queue: str, job_ids: Sequence[str]) -> tuple[list[Job], list[str]]:
        """These jobs as they are now, in one round trip: (the jobs, in order, without those gone meanwhile; why
        some could not be read: a hash jobcar cannot parse, a key of another type)."""
        keys = self.keys(queue)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        jobs, problems = [], []
        for job_id, reply in zip(job_ids, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, redis_errors.ResponseError):
                problems.append(f"job {job_id} in {queue}: its key holds another type ({reply})")
                continue
            if isinstance(reply, Exception):
                raise reply
            if not reply:
                continue
            job = readable(job_id, queue, {as_bytes(k): as_bytes(v) for k, v in reply.items()})
            if isinstance(job, str):
                problems.append(job)
            else:
                jobs.append(job)
        return jobs, problems

    async def fields(self, queue: str, job_ids: Sequence[str], fields: Sequence[str]) -> list[dict[bytes, bytes]]:
        """These fields of these jobs, in one call ({} for a job gone, or whose key holds another type)."""
        if not job_ids:
            return []
        (reply,) = await execute_async(self.redis, [job_fields_call(self.keys(queue), fields, job_ids)])
        return parse_job_fields(fields, job_ids, reply)


def readable(job_id: str, queue: str, fields: Any) -> Job | str:
    """The job, or why its hash cannot be read (written around the enqueue script)."""
    try:
        return parse_job(job_id, queue, fields)
    except (ValueError, KeyError, TypeError) as exc:
        return f"job {job_id} in queue {queue} cannot be read: {exc}"


def _refs(members: object) -> tuple[str, ...]:
    """A SET of job references, sorted; a key of another type (fsck reports it) reads as none."""
    if not isinstance(members, set):
        return ()
    return tuple(sorted(as_text(m) for m in members))
