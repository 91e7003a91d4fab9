"""A command handler's process: spawned in a group and tree of its own with the input on stdin, its output
read into bounded captures, ended on exit, timeout or cancellation with its whole tree.

Each run gets its own process group (`start_new_session`, so pgid == pid), and its whole process tree is
held by a `containment.ProcessTree` (a cgroup, else the handler as subreaper), which also holds the
descendants that left the group with `setsid()`. On timeout, cancel or drain the group and the rest of
the tree get SIGTERM, then SIGKILL after `kill_grace`; after the leader exits, what is left gets SIGKILL
anyway, and the run ends only once the tree is empty, so nothing a handler forked outlives its job
(within the limits `containment.py` states). stdout and stderr are read continuously into bounded
buffers: a handler writing gigabytes neither blocks on a full pipe nor grows the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from jobcar.attempt_desk import LiveAttempt
from jobcar.config_types import CommandHandler
from jobcar.executors.containment import ProcessTree
from jobcar.executors.guardian import Guardian
from jobcar.outcome import Outcome

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: How often the remaining members of a group are checked for after its leader exited on SIGTERM.
_GROUP_POLL: Final = 0.02
#: Time the output pipes get to reach EOF once the tree is dead. Only a process that escaped the tree
#: can hold them open longer, and it is not worth waiting for.
_PIPE_GRACE: Final = 1.0
#: Time a SIGKILLed tree gets to exit. SIGKILL cannot be ignored, but a process in an uninterruptible
#: sleep (a hung NFS mount) exits only when it wakes; the job must end all the same.
_KILL_WAIT: Final = 10.0

#: Cleanup tasks that outlive a cancelled job task; kept here so they are never garbage-collected early.
_CLEANUPS: set[asyncio.Task[Any]] = set()


class Capture:
    """A bounded copy of one output stream: the first or the last `limit` bytes, and the total count."""

    def __init__(self, limit: int, *, keep_tail: bool, tee: Callable[[bytes], None] | None = None) -> None:
        self.limit = max(0, limit)
        self.keep_tail = keep_tail
        self.total = 0
        self._kept = bytearray()
        #: Also given every chunk as it comes (a command's stderr for the job's log: `log_stderr`).
        self._tee = tee

    def feed(self, chunk: bytes) -> None:
        if self._tee is not None:
            self._tee(chunk)
        self.total += len(chunk)
        if self.keep_tail:
            self._kept += chunk
            excess = len(self._kept) - self.limit
            if excess > 0:
                # Deleting from the front of a bytearray is cheap (CPython moves its start pointer).
                del self._kept[:excess]
        else:
            room = self.limit - len(self._kept)
            if room > 0:
                self._kept += chunk[:room]

    @property
    def data(self) -> bytes:
        return bytes(self._kept)

    @property
    def truncated(self) -> bool:
        return self.total > len(self._kept)


@dataclass(frozen=True, slots=True)
class Ended:
    """How a handler's process ended: its exit code (negative: the signal), or its timeout."""

    code: int | None
    budget: float
    timed_out: bool
    #: SIGKILL was needed after the timeout's SIGTERM.
    forced: bool


class CommandProcess:
    """Runs one command handler's program, a process tree at a time. `guardian` and `use_cgroups` as for
    `CommandExecutor`."""

    def __init__(self, handler: CommandHandler, guardian: Guardian | None, *, use_cgroups: bool) -> None:
        self.handler = handler
        self._guardian = guardian
        self._use_cgroups = use_cgroups

    async def run(
        self,
        env: dict[str, str],
        stdin: bytes,
        budget: float,
        stdout: Capture,
        stderr: Capture,
        attempt: LiveAttempt | None = None,
    ) -> Ended | Outcome:
        """Run the command with `stdin` for up to `budget` seconds and end its whole tree; an Outcome when it
        could not be started. An extendable `attempt` sets the time instead: until its deadline, which its
        handler may move."""
        tree = ProcessTree.create(use_cgroups=self._use_cgroups)
        protocol = _HandlerProtocol(stdout, stderr)
        if self._guardian is not None and tree.cgroup is not None:
            # Guarded before the spawn: the handler may fork the moment it runs.
            self._guardian.guard_cgroup(str(tree.cgroup))
        # Spawning runs in its own task: cancelled halfway, asyncio would SIGKILL only the leader and
        # then wait for pipes that whatever it already forked keeps open. Let it finish instead, then
        # stop the whole tree like any other cancellation.
        start = _background(self._spawn(protocol, env, tree))
        try:
            transport = await _run_to_end(start)
        except asyncio.CancelledError:
            if not start.cancelled() and start.exception() is None:
                await _run_to_end(_background(self._stop(start.result(), protocol, tree, terminate=True)))
            else:
                await _run_to_end(_background(self._dispose(tree)))
            raise
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            await _run_to_end(_background(self._dispose(tree)))
            return Outcome.fail(f"cannot start command: {exc}")
        _feed(transport, stdin)
        timed_out = False
        try:
            try:
                async with asyncio.timeout(budget) if attempt is None else attempt.bounded():
                    await protocol.exited.wait()
            except TimeoutError:
                timed_out = True
        except asyncio.CancelledError:
            await _run_to_end(_background(self._stop(transport, protocol, tree, terminate=True)))
            raise
        forced = await _run_to_end(_background(self._stop(transport, protocol, tree, terminate=timed_out)))
        return Ended(transport.get_returncode(), budget, timed_out=timed_out, forced=forced)

    async def _spawn(
        self, protocol: _HandlerProtocol, env: dict[str, str], tree: ProcessTree
    ) -> asyncio.SubprocessTransport:
        program, *args = self.handler.command
        transport, _ = await asyncio.get_running_loop().subprocess_exec(
            lambda: protocol,
            program,
            *args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=self.handler.cwd,
            start_new_session=True,
            preexec_fn=tree.preexec(),
        )
        # No await between the spawn and guarding it: nothing can come in between.
        tree.started(transport.get_pid())
        if self._guardian is not None:
            self._guardian.guard(transport.get_pid())
        return transport

    async def _stop(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _HandlerProtocol,
        tree: ProcessTree,
        *,
        terminate: bool,
    ) -> bool:
        """Kill the job's group and the rest of its tree, wait for its leader to be reaped, the tree to
        be empty and its output to end. True if SIGKILL was needed to end a tree that had been sent
        SIGTERM."""
        pgid = transport.get_pid()
        forced = False
        try:
            if terminate:
                _signal_group(pgid, signal.SIGTERM)
                tree.signal(signal.SIGTERM, besides_group=pgid)
                forced = not await _wait_tree_exit(pgid, tree, protocol, self.handler.kill_grace)
            # Stragglers: whatever the leader forked must not outlive the job, even after a clean exit.
            await tree.kill()
            _signal_group(pgid, signal.SIGKILL)
            await protocol.exited.wait()
            await self._wait_killed(tree)
            try:
                async with asyncio.timeout(_PIPE_GRACE):
                    await protocol.closed.wait()
            except TimeoutError:
                pass  # a process that escaped the tree holds the pipes; stop reading instead
        except BaseException:
            # Torn down mid-cleanup (event loop shutdown): at least leave nothing running.
            tree.kill_now()
            _signal_group(pgid, signal.SIGKILL)
            raise
        finally:
            transport.close()
            if self._guardian is not None:
                self._guardian.release(pgid)
            self._close(tree)
        return forced

    async def _dispose(self, tree: ProcessTree) -> None:
        """End a tree whose spawn failed or was cancelled: its child may have joined it and forked."""
        try:
            tree.kill_now()
            await self._wait_killed(tree)
        finally:
            self._close(tree)

    async def _wait_killed(self, tree: ProcessTree) -> None:
        try:
            async with asyncio.timeout(_KILL_WAIT):
                await tree.wait_empty()
        except TimeoutError:
            log.warning("a handler process survived SIGKILL for %gs; the job ends all the same", _KILL_WAIT)

    def _close(self, tree: ProcessTree) -> None:
        # A cgroup that cannot be removed (still populated) stays guarded: if the daemon dies, the
        # watchdog kills and removes it.
        if tree.close() and self._guardian is not None and tree.cgroup is not None:
            self._guardian.release_cgroup(str(tree.cgroup))


class _HandlerProtocol(asyncio.SubprocessProtocol):
    """Consumes the handler's output as it arrives, straight into the bounded captures.

    A protocol rather than stream readers: every chunk is kept or dropped the moment it arrives (no
    intermediate buffer, no flow control to stall the child), and `process_exited` tells when the
    leader exited even while a forked child still holds the pipes (`Process.wait()` on CPython 3.11
    also waits for the pipes to close, so it would not return until the job's timeout).
    """

    def __init__(self, stdout: Capture, stderr: Capture) -> None:
        self._captures = {1: stdout, 2: stderr}
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        capture = self._captures.get(fd)
        if capture is not None and isinstance(data, bytes):
            capture.feed(data)

    def process_exited(self) -> None:
        self.exited.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


def _background(work: Coroutine[object, object, _T]) -> asyncio.Task[_T]:
    task = asyncio.create_task(work)
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)
    return task


async def _run_to_end(task: asyncio.Task[_T]) -> _T:
    """Wait for `task` to finish even if the caller is cancelled meanwhile, then re-raise the cancellation.

    The kill must complete before the job's task ends: a drain that sees the task done may return the
    job to pending at once, and its handler must not still be running then.
    """
    cancelled = False
    while not task.done():
        try:
            # wait() never cancels what it waits for, and never raises what the task raised.
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def _wait_tree_exit(pgid: int, tree: ProcessTree, protocol: _HandlerProtocol, grace: float) -> bool:
    """Wait up to `grace` seconds for the whole group and tree to exit; True if they did."""
    loop = asyncio.get_running_loop()
    until = loop.time() + grace
    try:
        async with asyncio.timeout(grace):
            await protocol.exited.wait()
    except TimeoutError:
        return False
    # The leader is gone; the others got the same SIGTERM and may still be cleaning up (a shell
    # wrapper dies at once, the program it runs may not). Without a handle on them, checking the
    # group and the tree is the only way to give them the rest of the grace. An exited group member
    # still counts until its new parent reaps it: under an init that reaps late or never (jobcar as
    # PID 1 without tini), this waits out the grace, never longer.
    while _group_exists(pgid) or tree.holds_processes():
        if loop.time() >= until:
            return False
        await asyncio.sleep(_GROUP_POLL)
    return True


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _feed(transport: asyncio.SubprocessTransport, payload: bytes) -> None:
    """Hand the payload to stdin and close it once written. The event loop writes it in the background;
    a handler that exits without reading it all only makes the loop drop the rest (EPIPE is quiet)."""
    # Typed as a BaseTransport; with stdin=PIPE it is the pipe's write transport on every loop.
    stdin = cast(asyncio.WriteTransport, transport.get_pipe_transport(0))
    # A handler that exits at once (before reading stdin) may already have closed the pipe: uvloop
    # then raises RuntimeError instead of quietly dropping the write.
    with contextlib.suppress(RuntimeError, ConnectionError):
        if not stdin.is_closing():
            if payload:
                stdin.write(payload)
            stdin.close()
