"""`jobcar fsck`: check one queue's keys against the invariants of docs/protocol.md, and repair them.

The check reads with plain commands (SCAN for the job hashes and unique locks, then the four state
sets), so under a running daemon its picture is not one instant: a job acked or leased between two
reads may look inconsistent for a moment. That is why every repair is a small Lua script that first
re-checks, atomically and against the current data, the very condition it repairs, and does nothing
when it no longer holds (a transition meanwhile fixed or replaced it). A script is atomic in Redis:
no daemon transition can run between its check and its writes, so a repair never overwrites a newer
state with one computed from a stale read. A finding whose condition was gone when its repair ran was
a passing view, not corruption, and is dropped from the result.

Repairs touch only keys of the queue's hash tag, so each script stays in one Cluster slot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from jobcar import store
from jobcar.job import STORED_IN_SETS, State
from jobcar.store import DeadLetterLimits, QueueKeys, SyncRedis

__all__ = ["Finding", "Kind", "check_queue"]

#: A repaired done/canceled hash without a TTL, or a unique lock without one (its unique_for is
#: unknown), expires after this long.
REPAIR_TTL_MS: Final = 86400 * 1000
SCAN_COUNT: Final = 1000
_CHUNK: Final = 500


class Kind:
    """The kinds of finding (the `kind` of a Finding)."""

    SEVERAL_SETS: Final = "several_sets"  # an id in two or more of the state sets
    MISSING_HASH: Final = "missing_hash"  # an id in a set without a job hash
    ORPHAN_HASH: Final = "orphan_hash"  # a pending/scheduled/dead hash in no set
    NO_TTL: Final = "no_ttl"  # a done/canceled hash that never expires
    BAD_STATE: Final = "bad_state"  # a hash in no set whose state is missing or unknown
    STATE_MISMATCH: Final = "state_mismatch"  # the hash's state is not the one set it is in
    ACTIVE_WITHOUT_LEASE: Final = "active_without_lease"  # active, but no token or no deadline entry
    DUPLICATE_PENDING: Final = "duplicate_pending"  # an id listed more than once in pending
    STALE_UNIQUE: Final = "stale_unique"  # a unique lock pointing at a missing or finished job
    UNIQUE_NO_TTL: Final = "unique_no_ttl"  # a unique lock that never expires
    DEAD_OVER_LIMIT: Final = "dead_over_limit"  # the dead set beyond max_jobs or max_age


@dataclass(frozen=True, slots=True)
class Finding:
    queue: str
    kind: str
    #: The job id, or for unique-lock findings the lock's key, or "dead" for the dead set's bounds.
    job_id: str
    detail: str
    repaired: bool = False

    def line(self) -> str:
        return f"{self.queue} {self.kind} {self.job_id}: {self.detail}" + (" [repaired]" if self.repaired else "")

    def as_json(self) -> dict[str, object]:
        return {
            "queue": self.queue,
            "kind": self.kind,
            "id": self.job_id,
            "detail": self.detail,
            "repaired": self.repaired,
        }


# -- repair scripts ---------------------------------------------------------------------------------
#
# Each returns 1 when it repaired, 0 when the condition it repairs no longer holds (nothing written).
# Every one re-reads all it decides on. KEYS[1..4] are always pending scheduled active dead; ARGV[1]
# is the queue's prefix and ARGV[2] the job id (or lock key).

_HEAD: Final = """#!lua flags=allow-oom
local prefix, id = ARGV[1], ARGV[2]
local job = prefix .. 'job:' .. id
local function in_sets()
  local found = {}
  if redis.call('LPOS', KEYS[1], id) then found[#found + 1] = 'pending' end
  if redis.call('ZSCORE', KEYS[2], id) then found[#found + 1] = 'scheduled' end
  if redis.call('ZSCORE', KEYS[3], id) then found[#found + 1] = 'active' end
  if redis.call('ZSCORE', KEYS[4], id) then found[#found + 1] = 'dead' end
  return found
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function wake()
  if redis.call('EXISTS', KEYS[5]) == 0 then redis.call('RPUSH', KEYS[5], '1') end
end
-- An active job whose lease is unknown goes back to pending, its attempt unchanged (as reap does).
local function to_pending()
  redis.call('ZREM', KEYS[3], id)
  redis.call('HSET', job, 'state', 'pending')
  redis.call('HDEL', job, 'token', 'started')
  if not redis.call('LPOS', KEYS[1], id) then redis.call('LPUSH', KEYS[1], id) end
  wake()
end
"""

_REPAIRS: Final = {
    # ARGV[3]: the set the id is to leave. Only while the job still has no hash.
    Kind.MISSING_HASH: """
if redis.call('EXISTS', job) == 1 then return 0 end
local keys = {pending = KEYS[1], scheduled = KEYS[2], active = KEYS[3], dead = KEYS[4]}
if ARGV[3] == 'pending' then return redis.call('LREM', KEYS[1], 0, id) > 0 and 1 or 0 end
return redis.call('ZREM', keys[ARGV[3]], id)
""",
    # A hash in no set goes where its state says; ARGV[3] is the state the check saw.
    Kind.ORPHAN_HASH: """
local state = redis.call('HGET', job, 'state')
if state ~= ARGV[3] or #in_sets() > 0 then return 0 end
local now = now_ms()
if state == 'pending' then
  redis.call('LPUSH', KEYS[1], id)
  wake()
elseif state == 'scheduled' then
  local run_at = tonumber(redis.call('HGET', job, 'run_at') or '') or now
  redis.call('ZADD', KEYS[2], run_at, id)
  wake()
elseif state == 'dead' then
  redis.call('ZADD', KEYS[4], now, id)
else
  return 0
end
return 1
""",
    Kind.NO_TTL: """
local state = redis.call('HGET', job, 'state')
if (state ~= 'done' and state ~= 'canceled') or redis.call('PTTL', job) ~= -1 or #in_sets() > 0 then return 0 end
redis.call('PEXPIRE', job, ARGV[3])
return 1
""",
    # The hash takes the state of the one set the id is in; ARGV[3] is that set, ARGV[4] the state seen.
    Kind.STATE_MISMATCH: """
local sets = in_sets()
local state = redis.call('HGET', job, 'state')
if #sets ~= 1 or sets[1] ~= ARGV[3] or state == ARGV[3] or (state or '') ~= ARGV[4] then return 0 end
if ARGV[3] == 'active' and not redis.call('HGET', job, 'token') then
  to_pending()
  return 1
end
redis.call('HSET', job, 'state', ARGV[3])
if ARGV[3] ~= 'active' then redis.call('HDEL', job, 'token') end
return 1
""",
    # An active job without a token, or without a deadline entry: back to pending.
    Kind.ACTIVE_WITHOUT_LEASE: """
if redis.call('HGET', job, 'state') ~= 'active' then return 0 end
local sets = in_sets()
local token = redis.call('HGET', job, 'token')
if #sets == 0 or (#sets == 1 and sets[1] == 'active' and not token) then
  to_pending()
  return 1
end
return 0
""",
    # Keep one entry, the one nearest the right end (the first to be leased). ARGV[3] is unused.
    Kind.DUPLICATE_PENDING: """
local n = #redis.call('LPOS', KEYS[1], id, 'COUNT', 0)
if n < 2 then return 0 end
redis.call('LREM', KEYS[1], n - 1, id)
return 1
""",
    # ARGV[2] is the lock's key, ARGV[3] the job id it held when checked.
    Kind.STALE_UNIQUE: """
local holder = redis.call('GET', id)
if holder ~= ARGV[3] then return 0 end
local state = redis.call('HGET', prefix .. 'job:' .. holder, 'state')
if state == 'pending' or state == 'scheduled' or state == 'active' then return 0 end
redis.call('DEL', id)
return 1
""",
    Kind.UNIQUE_NO_TTL: """
if redis.call('PTTL', id) ~= -1 then return 0 end
redis.call('PEXPIRE', id, ARGV[3])
return 1
""",
}

# The dead-set trim: _lib.lua's trim_dead, called until the set is within bounds. Bounded per call
# like every transition; the caller repeats it.
_TRIM_DEAD: Final = """
local max_jobs, max_age = tonumber(ARGV[3]), tonumber(ARGV[4])
local before = redis.call('ZCARD', KEYS[4])
trim_dead(prefix, KEYS[4], max_jobs, max_age, now_ms())
return before - redis.call('ZCARD', KEYS[4])
"""


def _run(client: SyncRedis, keys: QueueKeys, kind: str, source: str, args: Sequence[str | int]) -> int:
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.dead, keys.wake)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("EVAL", source, len(script_keys), *script_keys, keys.prefix, *args)
    reply: Any = pipe.execute()[0]
    return int(reply)


def _repair(client: SyncRedis, keys: QueueKeys, kind: str, *args: str | int) -> bool:
    return _run(client, keys, kind, _HEAD + _REPAIRS[kind], args) == 1


# -- reading --------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _scan(client: SyncRedis, pattern: str) -> list[str]:
    return sorted({_text(k) for k in client.scan_iter(match=pattern, count=SCAN_COUNT)})


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


@dataclass(frozen=True, slots=True)
class _Hash:
    state: str | None
    token: bool
    pttl: int


def _read_hashes(client: SyncRedis, keys: QueueKeys, ids: Sequence[str]) -> dict[str, _Hash]:
    hashes: dict[str, _Hash] = {}
    for chunk in _chunks(ids):
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["state", "token"])
            pipe.pttl(keys.job(job_id))
        replies = pipe.execute()
        for i, job_id in enumerate(chunk):
            (state, token), pttl = replies[2 * i], replies[2 * i + 1]
            if int(pttl) == -2:
                continue  # gone since the scan
            hashes[job_id] = _Hash(None if state is None else _text(state), token is not None, int(pttl))
    return hashes


def _read_sets(client: SyncRedis, keys: QueueKeys) -> tuple[list[str], dict[str, list[tuple[str, float]]]]:
    pipe = client.pipeline(transaction=False)
    pipe.lrange(keys.pending, 0, -1)
    for key in (keys.scheduled, keys.active, keys.dead):
        pipe.zrange(key, 0, -1, withscores=True)
    pending, *zsets = pipe.execute()
    names = (State.SCHEDULED.value, State.ACTIVE.value, State.DEAD.value)
    return [_text(m) for m in pending], {
        name: [(_text(m), float(s)) for m, s in members] for name, members in zip(names, zsets, strict=True)
    }


def _redis_now_ms(client: SyncRedis) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")
    seconds, micros = pipe.execute()[0]
    return int(seconds) * 1000 + int(micros) // 1000


# -- the check ------------------------------------------------------------------------------------


def check_queue(client: SyncRedis, keys: QueueKeys, *, repair: bool, dead_limits: DeadLetterLimits) -> list[Finding]:
    """Every inconsistency found in one queue's keys; with `repair`, each is repaired where a safe repair
    exists, and marked so. A finding whose condition was gone by the time its repair ran is left out."""
    findings: list[Finding] = []

    def found(kind: str, job_id: str, detail: str, *repair_args: str | int, fixable: bool = True) -> None:
        repaired = False
        if repair and fixable:
            repaired = _repair(client, keys, kind, job_id, *repair_args)
            if not repaired:
                return  # the condition no longer holds: a transition changed the job meanwhile
        findings.append(Finding(keys.queue, kind, job_id, detail, repaired))

    job_prefix = keys.job("")
    ids = [key[len(job_prefix) :] for key in _scan(client, _glob_escape(job_prefix) + "*")]
    hashes = _read_hashes(client, keys, ids)
    pending, zsets = _read_sets(client, keys)

    sets: dict[str, list[str]] = {}
    pending_count: dict[str, int] = {}
    for job_id in pending:
        pending_count[job_id] = pending_count.get(job_id, 0) + 1
        if pending_count[job_id] == 1:
            sets.setdefault(job_id, []).append(State.PENDING.value)
    for name, members in zsets.items():
        for job_id, _ in members:
            sets.setdefault(job_id, []).append(name)

    # Ids in the sets: several sets, no hash, duplicates in pending, a state that disagrees.
    for job_id in sorted(sets):
        where = sets[job_id]
        job = hashes.get(job_id)
        if job is None:
            for name in where:
                found(Kind.MISSING_HASH, job_id, f"in {name} without a job hash", name)
            continue
        if pending_count.get(job_id, 0) > 1:
            found(Kind.DUPLICATE_PENDING, job_id, f"listed {pending_count[job_id]} times in pending")
        if len(where) > 1:
            # No safe repair: which set is right is a guess (a lease may be running). Reported only.
            found(
                Kind.SEVERAL_SETS,
                job_id,
                f"in {' and '.join(where)} (hash state {job.state or 'missing'})",
                fixable=False,
            )
            continue
        (name,) = where
        if job.state != name:
            found(
                Kind.STATE_MISMATCH,
                job_id,
                f"in {name} but its hash says {job.state or 'nothing'}",
                name,
                job.state or "",
            )
        elif name == State.ACTIVE.value and not job.token:
            found(Kind.ACTIVE_WITHOUT_LEASE, job_id, "active without a lease token")

    # Hashes in no set.
    runnable = {s.value for s in STORED_IN_SETS}
    for job_id, job in sorted(hashes.items()):
        if job_id in sets:
            continue
        if job.state == State.ACTIVE.value:
            found(Kind.ACTIVE_WITHOUT_LEASE, job_id, "active without a deadline in the active set")
        elif job.state in runnable:
            found(Kind.ORPHAN_HASH, job_id, f"hash in state {job.state} is in no set", job.state or "")
        elif job.state in (State.DONE.value, State.CANCELED.value):
            if job.pttl == -1:
                found(Kind.NO_TTL, job_id, f"{job.state} job without a TTL", REPAIR_TTL_MS)
        else:
            found(Kind.BAD_STATE, job_id, f"hash in no set with state {job.state or 'missing'}", fixable=False)

    # Unique locks.
    locks = _scan(client, _glob_escape(keys.unique("")) + "*")
    for chunk in _chunks(locks):
        pipe = client.pipeline(transaction=False)
        for lock in chunk:
            pipe.get(lock)
            pipe.pttl(lock)
        replies = pipe.execute()
        holders = [None if replies[2 * i] is None else _text(replies[2 * i]) for i in range(len(chunk))]
        live = {h for h in holders if h is not None}
        states = {h: j.state for h, j in hashes.items() if h in live}
        for i, lock in enumerate(chunk):
            holder, pttl = holders[i], int(replies[2 * i + 1])
            if holder is None:
                continue  # expired since the scan
            state = states.get(holder)
            if state not in (State.PENDING.value, State.SCHEDULED.value, State.ACTIVE.value):
                what = "a missing job" if state is None else f"a {state} job"
                found(Kind.STALE_UNIQUE, lock, f"held by {what} {holder}", holder)
            elif pttl == -1:
                found(Kind.UNIQUE_NO_TTL, lock, f"held by {holder} without a TTL", REPAIR_TTL_MS)

    # The dead set's bounds.
    now = _redis_now_ms(client)
    dead = zsets[State.DEAD.value]
    over = len(dead) - dead_limits.max_jobs if dead_limits.max_jobs > 0 else 0
    old = sum(1 for _, died in dead if died < now - dead_limits.max_age_ms) if dead_limits.max_age_ms > 0 else 0
    if over > 0 or old > 0:
        detail = (
            f"{len(dead)} dead jobs ({max(over, 0)} over max_jobs {dead_limits.max_jobs}, "
            f"{old} older than {dead_limits.max_age_ms} ms)"
        )
        repaired = False
        if repair:
            source = store.with_helpers("#!lua flags=allow-oom", "local prefix = ARGV[1]\n" + _TRIM_DEAD)
            args = ("", dead_limits.max_jobs, dead_limits.max_age_ms)
            trimmed = 0
            while (n := _run(client, keys, Kind.DEAD_OVER_LIMIT, source, args)) > 0:
                trimmed += n
            repaired = True
            detail += f"; trimmed {trimmed}"
        findings.append(Finding(keys.queue, Kind.DEAD_OVER_LIMIT, "dead", detail, repaired))
    return findings
