"""The Redis state machine: key layout, the Lua transitions, and how they are called.

Every transition that changes a job's state is one Lua script in `lua/` (see docs/protocol.md for
each script's KEYS/ARGV/return contract). This module builds the calls and parses the replies as
plain functions, so that the synchronous producer client, the asynchronous client and the daemon
share one implementation and differ only in how they send a batch of calls (`execute` and
`execute_async`).

Only the standard library and redis-py are imported: the producer client runs where nothing else is
installed (a Spark executor that gets jobcar as a zip).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Final, TypeAlias, cast

import redis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

from jobcar.job import EnqueueStatus, Job, JobInfo, State

SyncRedis: TypeAlias = "redis.Redis | redis.RedisCluster"
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"
Arg: TypeAlias = bytes | str | int | float
Reply: TypeAlias = object

DEFAULT_NAMESPACE: Final = "jobcar"
DEFAULT_QUEUE: Final = "default"
#: Jobs per enqueue script call in enqueue_many: big enough to amortise the round trip, small enough
#: that one call never blocks the server for long.
ENQUEUE_CHUNK: Final = 500
#: Jobs moved per requeue/purge call; "all" repeats the call until nothing is left.
BULK_LIMIT: Final = 1000

# ---------------------------------------------------------------------------------------------
# Key layout


def queues_key(namespace: str) -> str:
    """The SET of known queue names (written by producers outside the scripts: it crosses slots)."""
    return f"{namespace}:queues"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Every key of one queue. All carry the hash tag `{<queue>}`, so they live in one Cluster slot."""

    namespace: str
    queue: str
    prefix: str
    pending: str
    scheduled: str
    active: str
    dead: str
    wake: str
    paused: str

    @classmethod
    def of(cls, namespace: str, queue: str) -> QueueKeys:
        return _queue_keys(namespace, queue)

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def unique(self, unique_key: str) -> str:
        return f"{self.prefix}unique:{unique_key}"

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    def alive(self, daemon_id: str) -> str:
        return f"{self.prefix}alive:{daemon_id}"


@lru_cache(maxsize=4096)
def _queue_keys(namespace: str, queue: str) -> QueueKeys:
    # Producers and the daemon ask for the same few queues on every call; the keys never change.
    prefix = f"{namespace}:{{{queue}}}:"
    return QueueKeys(
        namespace=namespace,
        queue=queue,
        prefix=prefix,
        pending=prefix + "pending",
        scheduled=prefix + "scheduled",
        active=prefix + "active",
        dead=prefix + "dead",
        wake=prefix + "wake",
        paused=prefix + "paused",
    )


# ---------------------------------------------------------------------------------------------
# Scripts


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def script(name: str) -> Script:
    """Load `lua/<name>.lua` with the helpers of `lua/_lib.lua` it uses inserted after its shebang.

    Read through importlib.resources so it also works when jobcar is imported from a zip file.
    """
    body = (resources.files("jobcar") / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    shebang, _, rest = body.partition("\n")
    if not shebang.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua must start with a #!lua shebang line")
    source = with_helpers(shebang, rest)
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


_LUA_DEFINITION: Final = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.MULTILINE)
_LUA_NAME: Final = re.compile(r"[A-Za-z_]\w*")
_LUA_COMMENT: Final = re.compile(r"--.*")


@dataclass(frozen=True, slots=True)
class _Helper:
    """One blank-line-separated block of `_lib.lua`: the names it defines and the names its code uses."""

    text: str
    defines: frozenset[str]
    uses: frozenset[str]


def _names_used(lua: str) -> frozenset[str]:
    return frozenset(_LUA_NAME.findall(_LUA_COMMENT.sub("", lua)))


@cache
def _helpers() -> tuple[_Helper, ...]:
    text = (resources.files("jobcar") / "lua" / "_lib.lua").read_text(encoding="utf-8")
    blocks = (block for block in text.split("\n\n") if _LUA_DEFINITION.search(block))
    return tuple(_Helper(b, frozenset(_LUA_DEFINITION.findall(b)), _names_used(b)) for b in blocks)


def with_helpers(shebang: str, body: str) -> str:
    """`shebang`, the `_lib.lua` blocks that `body` needs (directly or through other helpers), `body`.

    Redis runs a script's whole body on every call, so each helper a script carries costs a closure per
    call (all of _lib.lua added about 5 µs of Redis time to an enqueue). A helper only uses helpers defined above it
    (Lua locals), so one pass from the bottom up collects everything needed. Loading the whole file
    instead, as docs/protocol.md describes for other producers, runs the same.
    """
    wanted = set(_names_used(body))
    chosen: list[str] = []
    for helper in reversed(_helpers()):
        if helper.defines & wanted:
            chosen.append(helper.text)
            wanted |= helper.uses
    return "\n".join([shebang, *reversed(chosen), body])


@dataclass(frozen=True, slots=True)
class ScriptCall:
    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]

    def command(self) -> tuple[Arg, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


def call(name: str, keys: Sequence[str], args: Sequence[Arg]) -> ScriptCall:
    return ScriptCall(script(name), tuple(keys), tuple(args))


def execute(client: SyncRedis, calls: Sequence[ScriptCall]) -> list[Reply]:
    """Run script calls in one round trip (a non-transactional pipeline); replies in call order.

    A NOSCRIPT reply (a restarted or new server) means that call did not run: the scripts are loaded
    and just those calls are sent again. Any other error is raised after the batch completes.
    """
    if len(calls) == 1:
        return [_execute_one(client, calls[0])]
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command(*c.command())
    replies: list[Reply] = pipe.execute(raise_on_error=False)
    retry = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    if retry:
        for s in {calls[i].script for i in retry}:
            client.script_load(s.source)
        pipe = client.pipeline(transaction=False)
        for i in retry:
            pipe.execute_command(*calls[i].command())
        for i, reply in zip(retry, pipe.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    _raise_first_error(replies)
    return replies


@contextlib.contextmanager
def closed_transport_is_connection_error() -> Iterator[None]:
    """On uvloop, redis-py writing to a connection the peer has reset raises RuntimeError("unable to
    perform operation on <TCPTransport closed=True ...>; the handler is closed"), where asyncio's own
    loop raises an OSError that redis-py turns into ConnectionError. redis-py has dropped the
    connection either way: report it as the connection error it is, so that callers back off and
    retry as in any outage instead of treating it as a bug."""
    try:
        yield
    except RuntimeError as exc:
        if "handler is closed" not in str(exc):
            raise
        raise redis.exceptions.ConnectionError(f"connection lost while sending: {exc}") from exc


def _execute_one(client: SyncRedis, call: ScriptCall) -> Reply:
    """One call without a pipeline: the same round trip, a third less client-side work (a single
    `enqueue` is the hot path of many producers)."""
    # RedisCluster.execute_command has no annotations; Redis's returns Any. Either way a Reply.
    try:
        reply: Reply = client.execute_command(*call.command())  # type: ignore[no-untyped-call]
    except NoScriptError:
        client.script_load(call.script.source)
        reply = client.execute_command(*call.command())  # type: ignore[no-untyped-call]
    return reply


async def execute_async(client: AsyncRedis, calls: Sequence[ScriptCall], *, raise_on_error: bool = True) -> list[Reply]:
    """`execute` for redis.asyncio clients. With raise_on_error=False a failed call's reply is its
    exception, and the other calls' replies stand."""
    with closed_transport_is_connection_error():
        return await _execute_async(client, calls, raise_on_error)


async def _execute_async(client: AsyncRedis, calls: Sequence[ScriptCall], raise_on_error: bool) -> list[Reply]:
    if len(calls) == 1:
        return [await _execute_one_async(client, calls[0], raise_on_error)]
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command(*c.command())
    replies: list[Reply] = await pipe.execute(raise_on_error=False)
    retry = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
    if retry:
        for s in {calls[i].script for i in retry}:
            await client.script_load(s.source)
        pipe = client.pipeline(transaction=False)
        for i in retry:
            pipe.execute_command(*calls[i].command())
        for i, reply in zip(retry, await pipe.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    if raise_on_error:
        _raise_first_error(replies)
    return replies


async def _execute_one_async(client: AsyncRedis, call: ScriptCall, raise_on_error: bool) -> Reply:
    """One call without a pipeline, as `_execute_one`: the daemon's lease calls and its merged acks are
    mostly alone in their round trip."""
    try:
        try:
            reply: Reply = await client.execute_command(*call.command())
        except NoScriptError:
            await client.script_load(call.script.source)
            reply = await client.execute_command(*call.command())
    except redis.exceptions.ResponseError as exc:  # the script's error reply; a lost connection still raises
        if raise_on_error:
            raise
        return exc
    return reply


async def lease_on_wake(target: AsyncRedis | AbstractConnection, wake: str, timeout_s: int, lease: ScriptCall) -> Reply:
    """Wait on a queue's wake list (ADR 0002) with a lease call sent right behind the wait; the lease's reply.

    Redis runs the lease the moment the wait ends, by a wake or by the timeout, with no round trip to
    the caller in between: an idle daemon starts a new job one wake-up of each process sooner (ADR
    0005). The lease runs either way, so the caller must reserve the slots it asks for until the reply.

    `target` is best a connection the caller keeps for these waits (a standalone server's): a pipeline
    checked out of the pool for each wait cost the idle daemon ~0.1 ms more per wake-up (pool and
    pipeline machinery, run on a cold CPU; ADR 0005). A RedisCluster client gets a pipeline, which
    finds the queue's node.
    """
    with closed_transport_is_connection_error():
        if isinstance(target, AbstractConnection):  # TCP, TLS and unix sockets alike
            reply = await _lease_on_wake_on(target, wake, timeout_s, lease)
        else:
            pipe = target.pipeline(transaction=False)
            pipe.blmove(wake, wake, timeout_s, "RIGHT", "RIGHT")
            pipe.execute_command(*lease.command())
            reply = (await pipe.execute(raise_on_error=False))[1]
            if isinstance(reply, NoScriptError):  # the lease did not run: a restarted or new server
                reply = (await _execute_async(target, [lease], raise_on_error=True))[0]
    # An error of the wait itself (a wake key of another type, written by hand) is not raised: the lease
    # ran regardless and the jobs it took are the caller's now. It also deletes such a key once idle.
    if isinstance(reply, Exception):
        raise reply
    return reply


async def _lease_on_wake_on(connection: AbstractConnection, wake: str, timeout_s: int, lease: ScriptCall) -> Reply:
    wait = ("BLMOVE", wake, wake, "RIGHT", "RIGHT", timeout_s)
    # Replies are read whole or the connection is dropped (redis-py disconnects on a timeout, a lost
    # connection or a cancel mid-read), so the next wait never reads a stale reply; it reconnects.
    await connection.send_packed_command(connection.pack_commands([wait, lease.command()]), check_health=False)
    with contextlib.suppress(redis.exceptions.ResponseError):  # the wait's own error: see lease_on_wake
        await connection.read_response()
    try:
        reply: Reply = await connection.read_response()
    except NoScriptError:  # the lease did not run: a restarted or new server
        await connection.send_command("SCRIPT", "LOAD", lease.script.source)
        await connection.read_response()
        await connection.send_command(*lease.command())
        reply = await connection.read_response()
    return reply


class CallBatcher:
    """Coalesces script calls made by many tasks into one pipeline per round trip.

    While one batch is on the wire, new calls wait and go together in the next one: under load a
    round trip carries many calls (one per finished job, the acks of a queue merged into one), and an
    idle daemon still sends each call at once. A connection failure fails every call of its batch;
    callers retry as they would alone.
    """

    def __init__(
        self, client: AsyncRedis, guard: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None
    ) -> None:
        self.client = client
        # Entered around each round trip: the runner's RedisHealth.guard, which abandons a batch sent into
        # an outage once Redis answers again, so the calls queued behind it need not wait for its timeout.
        self.guard = guard or contextlib.nullcontext
        self._waiting: list[tuple[ScriptCall, asyncio.Future[Reply]]] = []
        self._sender: asyncio.Task[None] | None = None

    def call(self, script_call: ScriptCall) -> asyncio.Future[Reply]:
        """Queue a call; await the returned future for its reply. A plain function on purpose: every
        finished job awaits one, and a coroutine around the future was one more layer to create and
        resume per job (py-spy put ~8% of the daemon's samples there)."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting.append((script_call, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="script call batcher")
        return future

    async def _send(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            sent = coalesce([c for c, _ in batch])
            try:
                async with self.guard():
                    replies = await execute_async(self.client, [c for c, _ in sent], raise_on_error=False)
            except Exception as exc:
                replies = [exc] * len(sent)
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            for (sent_call, positions), reply in zip(sent, replies, strict=True):
                for position, own in zip(positions, split_reply(sent_call, reply, len(positions)), strict=True):
                    future = batch[position][1]
                    if future.done():
                        continue  # its caller was cancelled meanwhile
                    if isinstance(own, Exception):
                        future.set_exception(own)
                    else:
                        future.set_result(own)


def _raise_first_error(replies: Sequence[Reply]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


# ---------------------------------------------------------------------------------------------
# enqueue


@dataclass(slots=True)  # not frozen: its __init__ then costs a fifth of build_record, per job of enqueue_many
class EnqueueRecord:
    """One job to store, already validated and encoded by the client. Treat it as read-only."""

    id: str
    queue: str
    type: str
    payload: bytes
    content_type: str | None = None  # None: the default, application/json (not stored)
    run_at_ms: int = 0  # absolute run-at, producer's clock; 0: none
    delay_ms: int = 0  # relative to Redis time; 0: none
    unique_key: str | None = None
    unique_ttl_ms: int = 0
    max_attempts: int | None = None
    timeout_ms: int | None = None
    traceparent: str | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    batch: str | None = None

    def optional_fields(self) -> list[Arg]:
        """Hash fields beyond type and payload, only those given (every field costs memory per job)."""
        out: list[Arg] = []
        optional: tuple[tuple[str, Arg | None], ...] = (
            ("content_type", self.content_type),
            ("max_attempts", self.max_attempts),
            ("timeout", self.timeout_ms),
            ("traceparent", self.traceparent),
            ("meta", json.dumps(dict(self.meta), separators=(",", ":")) if self.meta else None),
            ("batch", self.batch),
        )
        for name, value in optional:
            if value is not None:
                out += [name, value]
        return out


def _by_queue(records: Sequence[EnqueueRecord]) -> dict[str, list[int]]:
    """Record indexes grouped per queue, queues in first-seen order, records in order within each."""
    groups: dict[str, list[int]] = {}
    for index, r in enumerate(records):
        groups.setdefault(r.queue, []).append(index)
    return groups


def enqueue_calls(namespace: str, records: Sequence[EnqueueRecord]) -> list[ScriptCall]:
    """One enqueue call per queue and chunk of ENQUEUE_CHUNK records (a call touches one queue/slot)."""
    calls: list[ScriptCall] = []
    for queue, indexes in _by_queue(records).items():
        keys = QueueKeys.of(namespace, queue)
        for start in range(0, len(indexes), ENQUEUE_CHUNK):
            args: list[Arg] = [keys.prefix]
            for index in indexes[start : start + ENQUEUE_CHUNK]:
                r = records[index]
                extra = r.optional_fields()
                args += [r.id, r.type, r.payload, r.run_at_ms, r.delay_ms, r.unique_key or "", r.unique_ttl_ms]
                args.append(len(extra) // 2)
                args += extra
            calls.append(call("enqueue", (keys.pending, keys.scheduled, keys.wake), args))
    return calls


_CREATED_STATES: Final = {b"pending": State.PENDING, b"scheduled": State.SCHEDULED}


def parse_enqueue(records: Sequence[EnqueueRecord], replies: Sequence[Reply]) -> list[JobInfo]:
    """Pair the replies of `enqueue_calls(records)` with the records, in the records' order."""
    entries = [entry for reply in replies for entry in _list(reply)]
    order = [index for indexes in _by_queue(records).values() for index in indexes]
    infos: list[JobInfo | None] = [None] * len(records)
    for index, entry in zip(order, entries, strict=True):
        record = records[index]
        if isinstance(entry, bytes):  # the common case, kept cheap: created, in this state
            created = _CREATED_STATES.get(entry) or State(entry.decode())
            infos[index] = JobInfo(record.id, record.queue, created, EnqueueStatus.CREATED)
        else:
            status, job_id, state = (_text(x) for x in _list(entry))
            infos[index] = JobInfo(job_id, record.queue, State(state), EnqueueStatus(status))
    return [info for info in infos if info is not None]


# ---------------------------------------------------------------------------------------------
# Daemon transitions


@dataclass(frozen=True, slots=True)
class LeasedJob:
    job: Job
    token: str


@dataclass(frozen=True, slots=True)
class LeaseResult:
    now_ms: int
    jobs: list[LeasedJob]
    #: Milliseconds until the earliest scheduled job is due; None when nothing is scheduled.
    next_due_ms: int | None
    paused: bool
    #: The lease was given the caller's alive key and found it gone: it took nothing, changed nothing.
    declined: bool
    #: Ids that were in the pending list without a job hash (corruption; reported, not runnable).
    missing: list[str]
    #: Leased jobs whose hash cannot be read (a producer wrote bad fields): (id, token, problem).
    #: The caller should kill them; they are leased, so nothing else will run them meanwhile.
    malformed: list[tuple[str, str, str]]


def lease_call(
    keys: QueueKeys,
    count: int,
    lease_ms: int,
    default_max_attempts: int,
    max_attempts_by_type: str = "{}",
    alive_key: str | None = None,
) -> ScriptCall:
    """`max_attempts_by_type` is a JSON object type -> max_attempts (encode it once per config). With
    `alive_key`, the lease takes nothing unless that key exists (ADR 0005)."""
    token_base = secrets.token_hex(8)
    script_keys = (keys.pending, keys.scheduled, keys.active, keys.wake, keys.paused)
    return call(
        "lease",
        script_keys if alive_key is None else (*script_keys, alive_key),
        (keys.prefix, count, lease_ms, token_base, default_max_attempts, max_attempts_by_type),
    )


def parse_lease(keys: QueueKeys, reply: Reply) -> LeaseResult:
    now, next_due, stopped, missing, *jobs = _list(reply)
    leased = []
    malformed = []
    for raw in jobs:
        items = _list(raw)
        job_id, token = items[0], items[1]
        try:
            # One iterator over the name/value pairs after id and token: no slices copied (~1 us a job). Zipped
            # with itself, strict: a name without a value is a ValueError.
            pairs = iter(items)
            next(pairs), next(pairs)
            if len(items) == 2 or type(items[2]) is bytes:  # a client without decode_responses (jobcar's own)
                fields = dict(zip(cast(Iterator[bytes], pairs), cast(Iterator[bytes], pairs), strict=True))
            else:
                fields = {_bytes(name): _bytes(value) for name, value in zip(pairs, pairs, strict=True)}
            leased.append(LeasedJob(Job.from_hash(_text(job_id), keys.queue, fields), _text(token)))
        except (ValueError, KeyError, TypeError) as exc:
            malformed.append((_text(job_id), _text(token), str(exc)))
    due = _int(next_due)
    return LeaseResult(
        now_ms=_int(now),
        jobs=leased,
        next_due_ms=None if due < 0 else due,
        paused=_int(stopped) == 1,
        declined=_int(stopped) == 2,
        missing=[_text(m) for m in _list(missing)],
        malformed=malformed,
    )


class ExtendStatus(IntEnum):
    LOST = 0
    RENEWED = 1
    CANCEL_REQUESTED = 2


def extend_call(keys: QueueKeys, lease_ms: int, leases: Iterable[tuple[str, str]]) -> ScriptCall:
    args: list[Arg] = [keys.prefix, lease_ms]
    for job_id, token in leases:
        args += [job_id, token]
    return call("extend", (keys.active,), args)


def parse_extend(reply: Reply) -> list[ExtendStatus]:
    """One status per lease passed to extend_call, in order."""
    _now, *statuses = _list(reply)
    return [ExtendStatus(_int(s)) for s in statuses]


def ack_call(
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    result: bytes | None = None,
    retention_ms: int = 0,
    final: State = State.DONE,
) -> ScriptCall:
    """Ack one job; `merge_acks` turns several of one queue into one call. The reply: `parse_ack`."""
    if final not in (State.DONE, State.CANCELED):
        raise ValueError(f"ack finishes a job as done or canceled, not {final}")
    args = (keys.prefix, job_id, token, final.value, retention_ms, result or b"")
    return call("ack", (keys.active, keys.job(job_id)), args)


def merge_acks(acks: Sequence[ScriptCall]) -> ScriptCall:
    """One ack call for the jobs of several (of one queue): the script takes one or many jobs, and a
    round trip under load then costs one script call instead of one per finished job."""
    first = acks[0]
    if any(a.script.name != "ack" or a.keys[0] != first.keys[0] for a in acks):
        raise ValueError("merge_acks takes ack calls of one queue")
    keys = (first.keys[0], *(key for a in acks for key in a.keys[1:]))
    args = (first.args[0], *(arg for a in acks for arg in a.args[1:]))
    return ScriptCall(first.script, keys, args)


def parse_ack(reply: Reply) -> list[int]:
    """One value per job of the call, in order: 1 finished, 0 lease lost (nothing changed)."""
    return [_int(r) for r in _list(reply)]


def coalesce(calls: Sequence[ScriptCall]) -> list[tuple[ScriptCall, list[int]]]:
    """The calls to send for `calls`: acks of one queue merged into one, every other call as it is.
    Each comes with the positions (in `calls`) of the calls it carries; `split_reply` undoes it."""
    sent: list[tuple[ScriptCall, list[int]]] = []
    acks_by_queue: dict[str, list[int]] = {}
    for position, c in enumerate(calls):
        if c.script.name == "ack":
            acks_by_queue.setdefault(c.keys[0], []).append(position)
        else:
            sent.append((c, [position]))
    for positions in acks_by_queue.values():
        sent.append((merge_acks([calls[p] for p in positions]), positions))
    return sent


def split_reply(sent: ScriptCall, reply: Reply, count: int) -> list[Reply]:
    """The replies of the `count` calls that `sent` carried (see `coalesce`): an ack's per-job values,
    or the one reply of any other call. An error reply is every carried call's reply."""
    if sent.script.name != "ack" or isinstance(reply, Exception):
        return [reply] * count
    return list(parse_ack(reply))


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    max_jobs: int = 10_000
    max_age_ms: int = 180 * 86400 * 1000


class RetryResult(IntEnum):
    LOST = 0
    RETRIED = 1
    DEAD = 2


def retry_call(
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    delay_ms: int,
    error: str,
    spend_attempt: bool = True,
    max_free_retries: int = 0,
    dead: DeadLetterLimits = DeadLetterLimits(),
) -> ScriptCall:
    """`max_free_retries` bounds how many attempts a job may give back in its life (0: no bound)."""
    return call(
        "retry",
        (keys.active, keys.pending, keys.scheduled, keys.dead, keys.wake, keys.job(job_id)),
        (keys.prefix, job_id, token, max(0, delay_ms), error, "1" if spend_attempt else "0",
         dead.max_jobs, dead.max_age_ms, max_free_retries),
    )  # fmt: skip


def kill_call(
    keys: QueueKeys, job_id: str, token: str, reason: str, dead: DeadLetterLimits = DeadLetterLimits()
) -> ScriptCall:
    return call(
        "kill",
        (keys.active, keys.dead, keys.job(job_id)),
        (keys.prefix, job_id, token, reason, dead.max_jobs, dead.max_age_ms),
    )


def reap_call(
    keys: QueueKeys, *, limit: int = 1000, default_max_attempts: int = 10, dead: DeadLetterLimits = DeadLetterLimits()
) -> ScriptCall:
    return call(
        "reap",
        (keys.active, keys.pending, keys.dead, keys.wake),
        (keys.prefix, limit, dead.max_jobs, dead.max_age_ms, default_max_attempts),
    )


def parse_reap(reply: Reply) -> dict[str, str]:
    """job id -> where it went: "pending", "dead" or "missing"."""
    flat = [_text(x) for x in _list(reply)]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def requeue_call(keys: QueueKeys, job_ids: Sequence[str] = (), limit: int = BULK_LIMIT) -> ScriptCall:
    return call("requeue", (keys.dead, keys.pending, keys.wake), (keys.prefix, limit, *job_ids))


def purge_call(keys: QueueKeys, job_ids: Sequence[str] = (), limit: int = BULK_LIMIT) -> ScriptCall:
    return call("purge", (keys.dead,), (keys.prefix, limit, *job_ids))


class CancelResult(StrEnum):
    CANCELED = "canceled"
    CANCEL_REQUESTED = "cancel_requested"
    NOT_CANCELABLE = "not_cancelable"
    MISSING = "missing"


def cancel_call(keys: QueueKeys, job_id: str) -> ScriptCall:
    return call("cancel", (keys.pending, keys.scheduled, keys.job(job_id)), (keys.prefix, job_id))


def parse_cancel(reply: Reply) -> tuple[CancelResult, State | None]:
    """(what cancel did, the job's state before it; None for a missing job)."""
    result, state = (_text(x) for x in _list(reply))
    return CancelResult(result), State(state) if state else None


def pause_call(keys: QueueKeys, paused: bool) -> ScriptCall:
    return call("pause", (keys.paused, keys.wake), (keys.prefix, "1" if paused else "0"))


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    now_ms: int
    pending: int
    scheduled: int
    active: int
    dead: int
    paused: bool
    #: When the longest-waiting runnable job became runnable (None: nothing waits).
    oldest_ready_ms: int | None

    @property
    def latency_s(self) -> float:
        """Age of the oldest runnable job, in seconds (0 when nothing waits)."""
        return 0.0 if self.oldest_ready_ms is None else max(0, self.now_ms - self.oldest_ready_ms) / 1000


def stats_call(keys: QueueKeys) -> ScriptCall:
    return call("stats", (keys.pending, keys.scheduled, keys.active, keys.dead, keys.paused), (keys.prefix,))


def parse_stats(keys: QueueKeys, reply: Reply) -> QueueStats:
    now, pending, scheduled, active, dead, paused, oldest = (_int(x) for x in _list(reply))
    return QueueStats(
        queue=keys.queue,
        now_ms=now,
        pending=pending,
        scheduled=scheduled,
        active=active,
        dead=dead,
        paused=paused == 1,
        oldest_ready_ms=None if oldest < 0 else oldest,
    )


# ---------------------------------------------------------------------------------------------
# Reads (plain commands: reading never changes state)


def parse_job(job_id: str, queue: str, fields: Mapping[Any, Any]) -> Job:
    """A Job from an HGETALL reply."""
    return Job.from_hash(job_id, queue, {_bytes(k): _bytes(v) for k, v in fields.items()})


def decode_names(members: Iterable[Any]) -> list[str]:
    """Sorted text of a SMEMBERS reply (the known queues)."""
    return sorted(_text(m) for m in members)


#: The counters of a batch hash (`<prefix>batch:<id>`), in the order `parse_batch` returns them.
BATCH_FIELDS: Final = ("total", "done", "dead", "canceled")


def parse_batch(reply: Reply) -> tuple[int, int, int, int]:
    """(total, done, dead, canceled) from `HMGET <prefix>batch:<id> total done dead canceled`; a counter
    that was never incremented (or a batch hash that is gone) reads as 0."""
    values = [0 if v is None else _int(v) for v in _list(reply)]
    if len(values) != len(BATCH_FIELDS):
        raise TypeError(f"expected {len(BATCH_FIELDS)} batch counters, got {reply!r}")
    return values[0], values[1], values[2], values[3]


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
        return [_text(m) for m in reversed(client.lrange(keys.pending, -limit, -1))]
    sets = {State.SCHEDULED: keys.scheduled, State.ACTIVE: keys.active, State.DEAD: keys.dead}
    if state not in sets:
        raise ValueError(f"jobs in state {state.value} are in no set")
    return [_text(m) for m in client.zrange(sets[state], 0, limit - 1)]


def job_hashes(client: SyncRedis, keys: QueueKeys, job_ids: Sequence[str]) -> list[dict[bytes, bytes]]:
    """The hashes of these jobs in one round trip, in order; an empty dict for a job that is gone."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hgetall(keys.job(job_id))
    return [{_bytes(k): _bytes(v) for k, v in reply.items()} for reply in pipe.execute()]


def find_job(client: SyncRedis, namespace: str, job_id: str, queues: Iterable[str]) -> dict[str, str]:
    """queue -> the job's state, for each of `queues` that holds a job with this id (ids are unique
    within a queue only, so there may be several), in the order of `queues`."""
    names = list(dict.fromkeys(queues))
    pipe = client.pipeline(transaction=False)
    for queue in names:
        pipe.hget(QueueKeys.of(namespace, queue).job(job_id), "state")
    return {queue: _text(state) for queue, state in zip(names, pipe.execute(), strict=True) if state is not None}


# ---------------------------------------------------------------------------------------------
# Reply decoding (clients are created with decode_responses=False: payloads are bytes)


def _list(reply: Reply) -> list[Reply]:
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply from a jobcar script, got {reply!r}")
    return reply


def _bytes(reply: Reply) -> bytes:
    if isinstance(reply, bytes):
        return reply
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, int):
        return str(reply).encode()
    raise TypeError(f"expected a string reply, got {reply!r}")


def _text(reply: Reply) -> str:
    return _bytes(reply).decode("utf-8", "replace")


def _int(reply: Reply) -> int:
    if isinstance(reply, int):
        return reply
    return int(_bytes(reply))
