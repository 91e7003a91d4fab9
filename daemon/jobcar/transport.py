"""Sending script calls to Redis: synchronously (producers, the CLI) and asynchronously (the daemon,
the HTTP API), in one round trip per batch of calls.

A NOSCRIPT reply (a restarted or new server) means that call did not run: the script is loaded and
just that call is sent again. `_to_resend` decides which, for both shells.

With a `ReplicaWait` (producers on Sentinel), a WAIT follows the calls on the same connection, in the
same round trip, and fewer replicas confirming than asked raises NotReplicated.

Only the standard library and redis-py are imported: the producer client sends through here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import redis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

from jobcar.scripts import Reply, Script, ScriptCall

SyncRedis: TypeAlias = "redis.Redis | redis.RedisCluster"
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"

#: Socket timeout for ordinary commands: a silent server is declared unreachable after this long.
COMMAND_TIMEOUT: Final = 10.0


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


def _to_resend(calls: Sequence[ScriptCall], replies: Sequence[Reply]) -> tuple[set[Script], list[int]]:
    """(the scripts to load, the positions of the calls to send again) after a pipeline's replies."""
    positions = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    return {calls[i].script for i in positions}, positions


def _raise_first_error(replies: Sequence[Reply]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def execute(client: SyncRedis, calls: Sequence[ScriptCall], *, wait: ReplicaWait | None = None) -> list[Reply]:
    """Run script calls in one round trip (a non-transactional pipeline); replies in call order. Any
    error is raised after the batch completes; then, with `wait`, NotReplicated."""
    if len(calls) == 1 and wait is None:
        # Without a pipeline: the same round trip, a third less client-side work (a single `enqueue` is
        # the hot path of many producers).
        try:
            return [client.execute_command(*calls[0].command())]  # type: ignore[no-untyped-call]
        except NoScriptError:
            client.script_load(calls[0].script.source)
            return [client.execute_command(*calls[0].command())]  # type: ignore[no-untyped-call]
    waits: list[Reply] = []
    replies = _pipelined(client, calls, wait, waits)
    scripts, resend = _to_resend(calls, replies)
    if resend:
        for s in scripts:
            client.script_load(s.source)
        for i, reply in zip(resend, _pipelined(client, [calls[i] for i in resend], wait, waits), strict=True):
            replies[i] = reply
    replies = _unconfirmed(wait, waits, replies)
    _raise_first_error(replies)
    return replies


def _pipelined(
    client: SyncRedis, calls: Sequence[ScriptCall], wait: ReplicaWait | None, waits: list[Reply]
) -> list[Reply]:
    """The calls' replies from one pipeline; with `wait`, a WAIT behind them, whose reply goes to `waits`.
    WAIT counts the replicas holding every write its connection made: a pipeline keeps one connection."""
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command(*c.command())
    if wait is not None:
        pipe.execute_command(*wait.command())
    replies: list[Reply] = pipe.execute(raise_on_error=False)
    if wait is not None:
        waits.append(replies.pop())
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


async def execute_async(
    client: AsyncRedis, calls: Sequence[ScriptCall], *, raise_on_error: bool = True, wait: ReplicaWait | None = None
) -> list[Reply]:
    """`execute` for redis.asyncio clients. With raise_on_error=False a failed call's reply is its
    exception, and the other calls' replies stand."""
    with closed_transport_is_connection_error():
        if len(calls) == 1 and wait is None:  # the daemon's lease calls and merged acks are mostly alone
            return [await _execute_one_async(client, calls[0], raise_on_error)]
        waits: list[Reply] = []
        replies = await _pipelined_async(client, calls, wait, waits)
        scripts, resend = _to_resend(calls, replies)
        if resend:
            for s in scripts:
                await client.script_load(s.source)
            again = await _pipelined_async(client, [calls[i] for i in resend], wait, waits)
            for i, reply in zip(resend, again, strict=True):
                replies[i] = reply
    replies = _unconfirmed(wait, waits, replies)
    if raise_on_error:
        _raise_first_error(replies)
    return replies


async def _pipelined_async(
    client: AsyncRedis, calls: Sequence[ScriptCall], wait: ReplicaWait | None, waits: list[Reply]
) -> list[Reply]:
    """`_pipelined` for redis.asyncio clients."""
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command(*c.command())
    if wait is not None:
        pipe.execute_command(*wait.command())
    replies: list[Reply] = await pipe.execute(raise_on_error=False)
    if wait is not None:
        waits.append(replies.pop())
    return replies


async def _execute_one_async(client: AsyncRedis, call: ScriptCall, raise_on_error: bool) -> Reply:
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
    checked out of the pool for each wait costs more per wake-up (ADR 0005). A RedisCluster client gets
    a pipeline, which finds the queue's node.
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
                reply = await _execute_one_async(target, lease, raise_on_error=True)
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
