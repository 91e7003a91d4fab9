"""Sending to Redis, synchronously (producers, the CLI) and asynchronously (the daemon, the HTTP API),
each operation written once.

An operation is a generator that yields the Redis work it needs (`Request`) and receives each reply, or
has the work's exception raised where it yielded; `run_sync` and `run_async` drive one over a redis-py
client of either kind (the daemon's idle wait, `lease_on_wake`, is async only and sends by itself).

`run_calls` is the operation of a batch of script calls, in one round trip: a NOSCRIPT reply (a restarted
or new server) means that call did not run, so the script is loaded and just that call is sent again.
With a `ReplicaWait` (producers on Sentinel), a WAIT follows the calls on the same connection, in the
same round trip, and fewer replicas confirming than asked raises NotReplicated.

Only the standard library and redis-py are imported: the producer client sends through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

import redis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

from jobcar.scripts import Arg, Reply, Script, ScriptCall

SyncRedis: TypeAlias = "redis.Redis | redis.RedisCluster"
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"

#: Socket timeout for ordinary commands: a silent server is declared unreachable after this long.
COMMAND_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class Sleep:
    """A pause between two looks (the polling of the client's waits)."""

    seconds: float


#: What an operation yields, and what it gets back for it:
#: a tuple, one command (its name and arguments, as execute_command takes them) -> its reply;
#: a list of such tuples, one non-transactional pipeline -> their replies in order, an error as its reply;
#: a Script -> loaded (SCRIPT LOAD) on the server; a Sleep -> None, once the time has passed.
Request: TypeAlias = "tuple[Arg, ...] | list[tuple[Arg, ...]] | Script | Sleep"
T = TypeVar("T")
#: An operation returning T. What it receives is a reply of the kind its request asked for, hence Any.
Operation: TypeAlias = Generator[Request, Any, T]


def run_sync(client: SyncRedis, operation: Operation[T]) -> T:
    """Run an operation over a synchronous client: its result, or the exception it let through."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            request = operation.send(reply) if error is None else operation.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            if isinstance(request, tuple):
                reply = client.execute_command(*request)  # type: ignore[no-untyped-call]
            elif isinstance(request, list):
                pipe = client.pipeline(transaction=False)
                for command in request:
                    pipe.execute_command(*command)
                reply = pipe.execute(raise_on_error=False)
            elif isinstance(request, Script):
                reply = client.script_load(request.source)
            else:
                time.sleep(request.seconds)
                reply = None
        except Exception as exc:  # raised in the operation, where it asked for this work
            error = exc


async def run_async(client: AsyncRedis, operation: Operation[T], round_trips: RoundTrips | None = None) -> T:
    """`run_sync` over a redis.asyncio client; with `round_trips`, its commands share round trips with the
    other operations sending through them at the same time."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            request = operation.send(reply) if error is None else operation.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        error = None
        try:
            if round_trips is not None and isinstance(request, (tuple, list)):
                reply = await round_trips.send(request)
            elif isinstance(request, tuple):
                reply = await client.execute_command(*request)
            elif isinstance(request, list):
                pipe = client.pipeline(transaction=False)
                for command in request:
                    pipe.execute_command(*command)
                reply = await pipe.execute(raise_on_error=False)
            elif isinstance(request, Script):
                reply = await client.script_load(request.source)
            else:
                await asyncio.sleep(request.seconds)
                reply = None
        except RuntimeError as exc:
            error = _lost_connection(exc)
        except Exception as exc:  # raised in the operation, where it asked for this work
            error = exc


class RoundTrips:
    """The commands of operations running at the same time, sent together: a request made while no round trip
    is on the wire goes at once, from its own task, as it would without this; the requests made while one is
    on the wire wait and go together in the next, one pipeline, each answered with its own replies as if sent
    alone (a command's error reply raised, a pipeline's errors in place). Nothing is merged: every script call
    still runs by itself, in the order the requests came; only the round trips are shared. For many concurrent
    producers on one client (the HTTP API's enqueues).

    A round trip that failed as a whole (a lost connection) fails each of its requests as it would alone."""

    def __init__(self, client: AsyncRedis) -> None:
        self.client = client
        self._waiting: list[tuple[tuple[Arg, ...] | list[tuple[Arg, ...]], asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None
        self._on_the_wire = False
        #: Round trips made so far, however many requests each carried.
        self.sent = 0

    async def send(self, request: tuple[Arg, ...] | list[tuple[Arg, ...]]) -> Any:
        """One command's reply, or one pipeline's replies."""
        if self._on_the_wire:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._waiting.append((request, future))
            return await future
        self._on_the_wire = True
        self.sent += 1
        try:
            if isinstance(request, tuple):
                return await self.client.execute_command(*request)
            pipe = self.client.pipeline(transaction=False)
            for command in request:
                pipe.execute_command(*command)
            return await pipe.execute(raise_on_error=False)
        finally:
            self._on_the_wire = False
            if self._waiting:  # what came meanwhile goes together, from a task of its own
                self._on_the_wire = True
                self._sender = asyncio.create_task(self._send_waiting(), name="shared round trips")

    async def _send_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.sent += 1
                await self._round_trip(batch)
        finally:
            self._on_the_wire = False

    async def _round_trip(
        self, batch: list[tuple[tuple[Arg, ...] | list[tuple[Arg, ...]], asyncio.Future[Any]]]
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        for request, _ in batch:
            for command in [request] if isinstance(request, tuple) else request:
                pipe.execute_command(*command)
        try:
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except Exception as exc:  # every request of the round trip fails as it would alone
            for _, future in batch:
                if not future.done():
                    future.set_exception(_lost_connection(exc) if isinstance(exc, RuntimeError) else exc)
            return
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        at = 0
        for request, future in batch:
            if isinstance(request, tuple):
                reply, at = replies[at], at + 1
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)
            else:
                answered, at = replies[at : at + len(request)], at + len(request)
                if not future.done():
                    future.set_result(answered)


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """A write is acknowledged only once `replicas` replicas confirm they hold it (WAIT), waiting at most
    `timeout_ms`: Redis replicates asynchronously, so a write the primary alone holds is lost when a
    replica is promoted in its place."""

    replicas: int
    timeout_ms: int

    def command(self) -> tuple[str, int, int]:
        return ("WAIT", self.replicas, self.timeout_ms)


class NotReplicated(redis.exceptions.RedisError):
    """The primary ran the write, but fewer replicas than asked confirmed it in time: a failover now could
    lose it, so it is not acknowledged. Its outcome is unknown, as after a lost connection: send it again,
    with the same job id (add-if-absent) where the first one may have been stored."""


def execute(client: SyncRedis, calls: Sequence[ScriptCall], *, wait: ReplicaWait | None = None) -> list[Reply]:
    """Run script calls in one round trip (a non-transactional pipeline); replies in call order. Any
    error is raised after the batch completes; then, with `wait`, NotReplicated."""
    return run_sync(client, run_calls(calls, wait=wait))


async def execute_async(
    client: AsyncRedis, calls: Sequence[ScriptCall], *, raise_on_error: bool = True, wait: ReplicaWait | None = None
) -> list[Reply]:
    """`execute` for redis.asyncio clients. With raise_on_error=False a failed call's reply is its
    exception, and the other calls' replies stand."""
    return await run_async(client, run_calls(calls, raise_on_error=raise_on_error, wait=wait))


def run_calls(
    calls: Sequence[ScriptCall], *, raise_on_error: bool = True, wait: ReplicaWait | None = None
) -> Operation[list[Reply]]:
    """The operation of `execute` and `execute_async`, for operations that send script calls among others."""
    if len(calls) == 1 and wait is None:
        # Without a pipeline: the same round trip, a third less client-side work (a single `enqueue` is
        # the hot path of many producers; the daemon's lease calls and merged acks are mostly alone).
        command = calls[0].command()
        try:
            try:
                return [(yield command)]
            except NoScriptError:  # the call did not run: a restarted or new server
                yield calls[0].script
                return [(yield command)]
        except redis.exceptions.ResponseError as exc:  # the script's error reply; a lost connection still raises
            if raise_on_error:
                raise
            return [exc]
    waits: list[Reply] = []
    replies = yield from _pipelined(calls, wait, waits)
    resend = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if resend:
        for script in {calls[i].script for i in resend}:  # noqa: UP028 -- a set's iterator takes no reply
            yield script
        again = yield from _pipelined([calls[i] for i in resend], wait, waits)
        for i, reply in zip(resend, again, strict=True):
            replies[i] = reply
    replies = _unconfirmed(wait, waits, replies)
    if raise_on_error:
        raise_first_error(replies)
    return replies


def run_call(call: ScriptCall) -> Operation[Reply]:
    """The operation of one script call: its reply."""
    return (yield from run_calls([call]))[0]


def _pipelined(calls: Sequence[ScriptCall], wait: ReplicaWait | None, waits: list[Reply]) -> Operation[list[Reply]]:
    """The calls' replies from one pipeline; with `wait`, a WAIT behind them, whose reply goes to `waits`.
    WAIT counts the replicas holding every write its connection made: a pipeline keeps one connection."""
    commands = [c.command() for c in calls]
    if wait is not None:
        commands.append(wait.command())
    replies: list[Reply] = yield commands
    if wait is not None:
        waits.append(replies.pop())
    return replies


def _unconfirmed(wait: ReplicaWait | None, wait_replies: Sequence[Reply], replies: list[Reply]) -> list[Reply]:
    """`replies`, each call that succeeded replaced by NotReplicated (or by the WAIT's own error) unless every
    WAIT reply (one per pipeline sent) counts enough replicas."""
    if wait is None:
        return replies
    problem: Exception | None = None
    for reply in wait_replies:
        if isinstance(reply, Exception):
            problem = reply
        elif not isinstance(reply, int) or reply < wait.replicas:
            problem = NotReplicated(
                f"the primary stored the write but {reply!r} of the {wait.replicas} replicas asked for "
                f"confirmed it within {wait.timeout_ms} ms; it was not acknowledged: send it again"
            )
    return replies if problem is None else [r if isinstance(r, Exception) else problem for r in replies]


def raise_first_error(replies: Sequence[Reply]) -> None:
    """The first error among a pipeline's replies, raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


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
        lost = _lost_connection(exc)
        if lost is exc:
            raise
        raise lost from exc


def _lost_connection(exc: RuntimeError) -> Exception:
    """See `closed_transport_is_connection_error`: the ConnectionError a closed transport's RuntimeError is."""
    if "handler is closed" not in str(exc):
        return exc
    lost = redis.exceptions.ConnectionError(f"connection lost while sending: {exc}")
    lost.__cause__ = exc
    return lost


async def lease_on_wake(
    target: AsyncRedis | AbstractConnection, wake: str, timeout_s: int, lease: ScriptCall
) -> tuple[Reply, Reply]:
    """Wait on a queue's wake list (ADR 0002) with a lease call sent right behind the wait: (the wake's element
    that ended the wait, None at the timeout; the lease's reply).

    Redis runs the lease the moment the wait ends, by a wake or by the timeout, with no round trip to
    the caller in between: an idle daemon starts a new job one wake-up of each process sooner (ADR
    0005). The lease runs either way, so the caller must reserve the slots it asks for until the reply.

    `target` is best a connection the caller keeps for these waits (a standalone server's): a pipeline
    checked out of the pool for each wait costs more per wake-up (ADR 0005). A RedisCluster client gets
    a pipeline, which finds the queue's node.
    """
    with closed_transport_is_connection_error():
        if isinstance(target, AbstractConnection):  # TCP, TLS and unix sockets alike
            woken_by, reply = await _lease_on_wake_on(target, wake, timeout_s, lease)
        else:
            pipe = target.pipeline(transaction=False)
            pipe.blmove(wake, wake, timeout_s, "RIGHT", "RIGHT")
            pipe.execute_command(*lease.command())
            woken_by, reply = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):  # the lease did not run: a restarted or new server
                (reply,) = await execute_async(target, [lease])
    # An error of the wait itself (a wake key of another type, written by hand) is not raised: the lease
    # ran regardless and the jobs it took are the caller's now. It also deletes such a key once idle.
    if isinstance(reply, Exception):
        raise reply
    return woken_by, reply


async def _lease_on_wake_on(
    connection: AbstractConnection, wake: str, timeout_s: int, lease: ScriptCall
) -> tuple[Reply, Reply]:
    wait = ("BLMOVE", wake, wake, "RIGHT", "RIGHT", timeout_s)
    # Replies are read whole or the connection is dropped (redis-py disconnects on a timeout, a lost
    # connection or a cancel mid-read), so the next wait never reads a stale reply; it reconnects.
    await connection.send_packed_command(connection.pack_commands([wait, lease.command()]), check_health=False)
    woken_by: Reply = None
    with contextlib.suppress(redis.exceptions.ResponseError):  # the wait's own error: see lease_on_wake
        woken_by = await connection.read_response()
    try:
        reply: Reply = await connection.read_response()
    except NoScriptError:  # the lease did not run: a restarted or new server
        await connection.send_command("SCRIPT", "LOAD", lease.script.source)
        await connection.read_response()
        await connection.send_command(*lease.command())
        reply = await connection.read_response()
    return woken_by, reply
