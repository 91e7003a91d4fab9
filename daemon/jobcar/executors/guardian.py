"""No handler process outlives its daemon, even when the daemon is killed with SIGKILL.

Two layers, because neither is enough alone:

- `PR_SET_PDEATHSIG(SIGKILL)` on each handler's direct child (Linux): the kernel kills the child when
  the daemon dies. It does not reach grandchildren (a shell script's `sleep`, a worker pool), and it is
  armed per *thread*: it fires when the thread that forked exits (asyncio spawns from the loop thread).
- The guardian: one small watchdog process per daemon, started with `python -m
  jobcar.executors.guardian`, whose stdin is a pipe from the daemon. The daemon writes `+<pgid>` when a
  handler's process group starts and `-<pgid>` once that group is gone; likewise `+<path>` and
  `-<path>` for the cgroup holding an attempt's whole process tree (`containment.py`), which reaches
  the descendants that left the group with `setsid()`. Whatever way the daemon dies, the kernel closes
  its end of the pipe; the watchdog reads EOF, kills every cgroup (`cgroup.kill`, then removes it) and
  SIGKILLs every group still listed, and exits. On a clean shutdown nothing is left, so closing the
  pipe just ends the watchdog.

Both are best effort in the daemon: if the watchdog cannot start or dies, jobs still run (and the
daemon says so in its log); `PR_SET_PDEATHSIG` still covers the direct children.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import BinaryIO, Final

__all__ = ["Guardian"]

log = logging.getLogger(__name__)

_MAX_PID: Final = 2**31 - 1
#: Time the watchdog gets to exit after its pipe is closed before the daemon stops waiting for it.
_CLOSE_TIMEOUT: Final = 5.0
#: Time the watchdog waits for a killed cgroup to empty before it removes it (rmdir fails until then).
_CGROUP_EMPTY_TIMEOUT: Final = 5.0
#: Time the watchdog gets to start (an interpreter and this package's imports) and say it is ready.
_READY_TIMEOUT: Final = 30.0
_READY: Final = b"ready\n"
#: The watchdog imports this module by name: it gets the directory holding `jobcar/` on its path, so it
#: starts however the daemon found the package (installed, a source checkout, a zip on sys.path).
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[2])


class Guardian:
    """The daemon's side of the watchdog process. One per daemon; shared by all command executors."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._groups: set[int] = set()
        self._cgroups: set[str] = set()
        self._warned = False

    @property
    def pid(self) -> int | None:
        """The watchdog's pid while it runs."""
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return self._writable()

    async def start(self) -> None:
        """Start the watchdog. A failure is logged, not raised: jobs then run without this safety net."""
        if self._process is not None:
            return
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "jobcar.executors.guardian",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
                # Its own session: a terminal's Ctrl-C or a signal to the daemon's group must not
                # take the watchdog down with the daemon before it has done its job.
                start_new_session=True,
            )
        except OSError as exc:
            log.error("cannot start the handler guardian (handler processes may outlive a killed daemon): %s", exc)
            return
        # Until it has set its signals to SIG_IGN, a SIGTERM meant for the daemon would end it: only
        # count on it once it says it is ready.
        assert process.stdout is not None
        try:
            async with asyncio.timeout(_READY_TIMEOUT):
                ready = await process.stdout.readline()
        except TimeoutError:
            ready = b""
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise
        if ready != _READY:
            log.error(
                "the handler guardian did not start (handler processes may outlive a killed daemon): %s",
                f"it said {ready!r}" if ready else "no answer",
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return
        self._process = process
        log.debug("handler guardian started (pid %d)", process.pid)

    def guard(self, pgid: int) -> None:
        """Kill process group `pgid` if the daemon dies before `release(pgid)`."""
        self._groups.add(pgid)
        self._send(f"+{pgid}\n")

    def release(self, pgid: int) -> None:
        """Group `pgid` has been killed and reaped: the watchdog must forget it (the id may be reused)."""
        self._groups.discard(pgid)
        self._send(f"-{pgid}\n")

    def guard_cgroup(self, path: str) -> None:
        """Kill every process of the cgroup at `path` (absolute) and remove it if the daemon dies before
        `release_cgroup(path)`."""
        self._cgroups.add(path)
        self._send(f"+{path}\n")

    def release_cgroup(self, path: str) -> None:
        """The cgroup at `path` has been emptied and removed: the watchdog must forget it."""
        self._cgroups.discard(path)
        self._send(f"-{path}\n")

    async def close(self) -> None:
        """Close the pipe: the watchdog kills any group still guarded, then exits. Waited for, bounded."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
            with contextlib.suppress(ConnectionError):
                await process.stdin.wait_closed()
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT):
                await process.wait()
        except TimeoutError:
            log.warning("handler guardian (pid %d) did not exit; killing it", process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._groups or self._cgroups:
            log.warning(
                "handler guardian closed while %d process groups and %d cgroups were still running",
                len(self._groups),
                len(self._cgroups),
            )

    def _writable(self) -> bool:
        process = self._process
        return (
            process is not None
            and process.returncode is None
            and process.stdin is not None
            and not process.stdin.is_closing()
        )

    def _send(self, line: str) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return
        if not self._writable():
            self._warn_gone(process)
            return
        # No drain: lines are tiny, the watchdog reads as fast as they come, and guard() must stay
        # synchronous so no await sits between spawning a group and guarding it.
        try:
            process.stdin.write(line.encode())
        except (ConnectionError, RuntimeError) as exc:
            self._warn_gone(process, exc)

    def _warn_gone(self, process: asyncio.subprocess.Process, exc: BaseException | None = None) -> None:
        if self._warned:
            return
        self._warned = True
        detail = f": {exc}" if exc is not None else f" (exit status {process.returncode})"
        log.error(
            "handler guardian (pid %d) is gone%s; handler processes may outlive a killed daemon",
            process.pid,
            detail,
        )


def watch(stream: BinaryIO) -> None:
    """The watchdog's main loop: track groups and cgroups from `stream`; on EOF, kill what is left."""
    groups: set[int] = set()
    cgroups: set[str] = set()
    for raw in stream:
        line = raw.strip()
        if len(line) < 2 or line[:1] not in (b"+", b"-"):
            continue
        adding = line[:1] == b"+"
        if line[1:2] == b"/":
            path = os.fsdecode(line[1:])
            # Only ever a directory the daemon made for an attempt: never a write into any other file.
            if os.path.normpath(path) != path or not os.path.basename(path).startswith("jobcar-"):
                continue
            if adding:
                cgroups.add(path)
            else:
                cgroups.discard(path)
            continue
        if not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if not 1 < pgid <= _MAX_PID:
            continue  # never killpg(0) (our own group) or init's, nor what no pid_t can hold
        if adding:
            groups.add(pgid)
        else:
            groups.discard(pgid)
    # cgroups first: one write kills a whole tree, the members of its process group included.
    for path in cgroups:
        with contextlib.suppress(OSError):
            Path(path, "cgroup.kill").write_text("1")
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    _remove_cgroups(cgroups)


def _remove_cgroups(paths: set[str]) -> None:
    """Remove killed cgroups once empty (a cgroup holding a process cannot be removed), bounded."""
    deadline = time.monotonic() + _CGROUP_EMPTY_TIMEOUT
    left = set(paths)
    while left and time.monotonic() < deadline:
        for path in list(left):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # still populated: the kill is being delivered
            left.discard(path)
        if left:
            time.sleep(0.01)


def main() -> None:
    # The daemon's death is the only signal that matters: a SIGTERM meant for the daemon (systemd,
    # docker, a terminal) must not end the watchdog first.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        sys.stdout.buffer.write(_READY)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        # The daemon died before it read this (killed while starting): it handed over nothing to kill, and a
        # traceback here would land in its log stream. Leave without flushing stdout again at exit.
        os._exit(0)
    watch(sys.stdin.buffer)


if __name__ == "__main__":
    main()
