"""A thin synchronous driver over one queue's transitions, for the state-machine tests."""

from __future__ import annotations

from typing import Any

import redis

from jobcar import replies, transitions, transport
from jobcar.client import Client
from jobcar.job import Job, JobInfo, State
from jobcar.keys import QueueKeys
from jobcar.scripts import ScriptCall
from jobcar.transitions import DeadLetterLimits, LeaseResult

#: For `where`: how often the id is in the pending lists (every priority's), its scores in scheduled,
#: active and dead, and its hash.
_READ_JOB_AND_SETS = """
local in_pending = 0
for p = 0, 10 do
  local list = KEYS[1]
  if p == 10 then list = list .. ':released' elseif p > 0 then list = list .. ':' .. p end
  for _, id in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if id == ARGV[1] then in_pending = in_pending + 1 end
  end
end
local function score(key) return redis.call('ZSCORE', key, ARGV[1]) or false end
return {in_pending, score(KEYS[2]), score(KEYS[3]), score(KEYS[4]), redis.call('HGETALL', KEYS[5]), score(KEYS[6])}
"""


class QueueDriver:
    def __init__(self, client: redis.Redis | redis.RedisCluster, namespace: str, queue: str = "default") -> None:
        self.redis = client
        self.namespace = namespace
        self.keys = QueueKeys.of(namespace, queue)
        self.producer = Client(client, namespace=namespace)
        self.dead_limits = DeadLetterLimits()

    def run(self, call: ScriptCall) -> Any:
        return transport.execute(self.redis, [call])[0]

    def enqueue(self, job_type: str = "t", payload: Any = None, **options: Any) -> JobInfo:
        options.setdefault("queue", self.keys.queue)
        return self.producer.enqueue(job_type, payload, **options)

    def lease(
        self, count: int = 10, lease_ms: int = 30_000, max_attempts: int = 3, by_type: str = "{}", limits: str = "{}"
    ) -> LeaseResult:
        call = transitions.lease_call(self.keys, count, lease_ms, max_attempts, by_type, limits=limits)
        return transitions.parse_lease(self.keys, self.run(call))

    def lease_one(self, **kwargs: Any) -> transitions.LeasedJob:
        result = self.lease(count=1, **kwargs)
        assert len(result.jobs) == 1, f"expected one leased job, got {result}"
        return result.jobs[0]

    def extend(self, leases: list[tuple[str, str]], lease_ms: int = 30_000) -> list[transitions.ExtendStatus]:
        return transitions.parse_extend(self.run(transitions.extend_call(self.keys, lease_ms, leases)))

    def ack(self, job_id: str, token: str, **kwargs: Any) -> int:
        [finished] = transitions.parse_ack(self.run(transitions.ack_call(self.keys, job_id, token, **kwargs)))
        return finished

    def retry(
        self, job_id: str, token: str, delay_ms: int = 0, error: str = "boom", spend: bool = True, max_free: int = 0
    ) -> int:
        call = transitions.retry_call(
            self.keys, job_id, token, delay_ms=delay_ms, error=error, spend_attempt=spend,
            max_free_retries=max_free, dead=self.dead_limits,
        )  # fmt: skip
        return int(self.run(call))

    def kill(self, job_id: str, token: str, reason: str = "bad") -> int:
        return int(self.run(transitions.kill_call(self.keys, job_id, token, reason, self.dead_limits)))

    def reap(self, default_max_attempts: int = 3, limits: str = "{}") -> dict[str, str]:
        call = transitions.reap_call(
            self.keys, default_max_attempts=default_max_attempts, dead=self.dead_limits, limits=limits
        )
        return transitions.parse_reap(self.run(call)).moved

    def now_ms(self) -> int:
        """Redis time, which every script reads."""
        seconds, micros = self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def token(self, job_id: str) -> str:
        """The lease token of a job that is leased now."""
        job = self.job(job_id)
        assert job is not None, f"{job_id} has no hash"
        assert job.token is not None, f"{job_id} is not leased"
        return job.token

    def job(self, job_id: str) -> Job | None:
        fields = self.redis.hgetall(self.keys.job(job_id))
        return replies.parse_job(job_id, self.keys.queue, fields) if fields else None

    def sets_of(self, job_id: str) -> list[State]:
        """Every state set that holds this id (the invariant says: exactly one while the job exists)."""
        found = [State.PENDING] * sum(
            self.redis.lrange(key, 0, -1).count(job_id.encode()) for key in self.keys.pending_lists
        )
        for state, key in ((State.SCHEDULED, self.keys.scheduled), (State.ACTIVE, self.keys.active),
                           (State.DEAD, self.keys.dead), (State.WAITING, self.keys.waiting)):  # fmt: skip
            if self.redis.zscore(key, job_id) is not None:
                found.append(state)
        return found

    def where(self, job_id: str) -> State | None:
        """The job's state, after checking that its hash and its set agree. Sets and hash are read in one
        script, so a daemon moving the job meanwhile cannot make them disagree."""
        keys = (self.keys.pending, self.keys.scheduled, self.keys.active, self.keys.dead, self.keys.job(job_id),
                self.keys.waiting)  # fmt: skip
        pending, scheduled, active, dead, fields, waiting = self.redis.eval(
            _READ_JOB_AND_SETS, len(keys), *keys, job_id
        )
        scores = ((State.SCHEDULED, scheduled), (State.ACTIVE, active), (State.DEAD, dead), (State.WAITING, waiting))
        sets = [State.PENDING] * pending + [state for state, score in scores if score is not None]
        job = None
        if fields:
            job = replies.parse_job(job_id, self.keys.queue, dict(zip(fields[::2], fields[1::2], strict=True)))
        if job is None or job.state in (State.DONE, State.CANCELED):
            assert sets == [], f"{job_id} has no runnable hash but is in {sets}"
            return None if job is None else job.state
        assert sets == [job.state], f"{job_id}: hash says {job.state}, sets say {sets}"
        return job.state

    def snapshot(self) -> dict[bytes, object]:
        """Every key of the queue with its type, content and whether it expires: to prove a rejected call
        changed nothing. (Not DUMP: a large hash's DUMP follows its dict's order, which a read may rehash.)"""
        read = {
            b"string": self.redis.get,
            b"hash": lambda k: sorted(self.redis.hgetall(k).items()),
            b"list": lambda k: self.redis.lrange(k, 0, -1),
            b"zset": lambda k: self.redis.zrange(k, 0, -1, withscores=True),
            b"set": lambda k: sorted(self.redis.smembers(k)),
        }
        snapshot: dict[bytes, object] = {}
        for key in self.redis.scan_iter(match=self.keys.prefix + "*"):
            kind = self.redis.type(key)
            snapshot[key] = (kind, read[kind](key), self.redis.pttl(key) > 0)
        return snapshot
