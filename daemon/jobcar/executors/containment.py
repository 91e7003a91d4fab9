"""Holds every process of one handler attempt, so all of them can be signalled and killed together.

A process group is not enough: a descendant that calls `setsid()` (the double fork of a program that
daemonizes) leaves it, and killing the group no longer reaches it. Two ways to hold the whole tree,
the first that this process can use (ADR 0011):

- A cgroup v2 per attempt, a child of the daemon's own cgroup (`jobcar-<daemon pid>-<n>`). The handler
  joins it between fork and exec, so everything it ever forks is born inside, and neither `setsid()` nor
  re-parenting takes a process out. `cgroup.kill` (Linux 5.14) kills all of it at once; the guardian is
  told the path and kills it too if the daemon dies. Used where the daemon may create cgroups: root on a
  host, a unit with `Delegate=yes`, a container given a writable cgroup tree.
- Otherwise the handler is made a child subreaper (`PR_SET_CHILD_SUBREAPER`, kept across `execve`): an
  orphan of its tree is re-parented to the handler instead of to init, so while the handler runs its
  descendants are exactly the processes below it in /proc. On timeout, cancel and drain they are
  stopped (SIGSTOP, so none can fork away meanwhile) and killed. What this cannot hold: once the handler
  itself has exited, its orphans go to init and nothing tells them from other processes, so a daemon a
  handler leaves behind when it exits, or one alive when the daemon is SIGKILLed, survives as before.

The daemon itself is not made a subreaper: orphans would then be its children, and it would have to reap
them without stealing an exit status asyncio waits for (its child watchers wait per pid), while telling
them from the children it spawned (the guardian, the embedded server) — nothing in /proc says which.
The handler's process group is still signalled too, so a tree holds at least what the group held.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, NamedTuple

from jobcar.child_process import PRCTL, child_preexec

__all__ = ["ProcessTree"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER: Final = 36
#: How often a tree is checked again while it is being stopped or waited for.
_POLL: Final = 0.02
#: Rounds of SIGSTOP before the kill: each round stops what the last one found; bounded so that a
#: process that never stops (uninterruptible sleep) only delays the SIGKILL.
_FREEZE_ROUNDS: Final = 50
#: Names tried for a new attempt cgroup before giving up: names left by an earlier daemon with this pid.
_NAME_TRIES: Final = 100


class _Stat(NamedTuple):
    state: str
    ppid: int
    start: int


def _stat(pid: int) -> _Stat | None:
    """A process's state, parent and start time (which tells it from a later process with its pid)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name is in parentheses and may hold anything, spaces and ")" included.
    fields = text.rsplit(")", 1)[1].split()
    return _Stat(fields[0], int(fields[1]), int(fields[19]))


def _all_stats() -> Iterator[tuple[int, _Stat]]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                yield int(entry.name), stat


def _signal(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


class _CgroupParent:
    """Where this process creates attempt cgroups: its own cgroup v2 directory, found on first use."""

    def __init__(self) -> None:
        self._directory: Path | None = None
        self._probed = False
        self._names = itertools.count(1)

    def create(self) -> Path | None:
        """A new empty cgroup for one attempt, or None where this process cannot make one."""
        if not self._probed:
            self._probed = True
            self._directory = _own_cgroup_directory()
            if self._directory is None:
                log.info("no writable cgroup v2: handler process trees are held by a subreaper (ADR 0011)")
            else:
                _remove_left_behind(self._directory)
        if self._directory is None:
            return None
        for _ in range(_NAME_TRIES):
            path = self._directory / f"jobcar-{os.getpid()}-{next(self._names)}"
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue  # an earlier daemon's, with the same pid (a restarted container): not ours to reuse
            except OSError as exc:
                self._give_up(f"cannot create {path}: {exc}")
                return None
        else:
            self._give_up(f"{_NAME_TRIES} cgroup names taken in {self._directory}")
            return None
        if not (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                path.rmdir()
            self._give_up("the kernel has no cgroup.kill (Linux 5.14)")
            return None
        return path

    def _give_up(self, reason: str) -> None:
        self._directory = None
        log.warning("handler cgroups disabled (%s); process trees are held by a subreaper (ADR 0011)", reason)


def _remove_left_behind(directory: Path) -> None:
    """Remove the empty cgroups of daemons that died without a guardian to remove them. A cgroup that
    holds a process cannot be removed, so a live attempt's is never touched."""
    for path in directory.glob("jobcar-*-*"):
        owner = path.name.split("-")[1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()


def _own_cgroup_directory() -> Path | None:
    """This process's cgroup v2 directory if it may create cgroups there, else None."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in own if line.startswith("0::")), None)
    if relative is None:
        return None
    for mount in mounts:
        fields, _, filesystem = mount.partition(" - ")
        parts = fields.split()
        if not filesystem.startswith("cgroup2 ") or len(parts) < 5:
            continue
        root, mount_point = parts[3], parts[4].replace("\\040", " ")
        if relative != root and not relative.startswith(root.rstrip("/") + "/"):
            continue
        directory = Path(mount_point, relative[len(root) :].lstrip("/"))
        if os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK):
            return directory
    return None


_CGROUPS: Final = _CgroupParent()


class ProcessTree:
    """Every process of one handler attempt: its cgroup, or the handler's subtree while it runs.

    `create` before the spawn, `preexec` as the spawn's `preexec_fn`, `started` with the handler's pid
    right after; `close` once `holds_processes()` is False.
    """

    def __init__(self, cgroup: Path | None) -> None:
        self.cgroup = cgroup
        self._leader = 0
        #: pid -> start time of every process seen in the handler's subtree (subreaper mode only).
        self._members: dict[int, int] = {}

    @classmethod
    def create(cls, *, use_cgroups: bool) -> ProcessTree:
        return cls(_CGROUPS.create() if use_cgroups else None)

    def preexec(self) -> Callable[[], None]:
        """The handler's `preexec_fn`: what every child does (`child_process`: its own session, the
        parent-death signal), then joining the cgroup or becoming a subreaper. Runs in the child between
        fork and exec, so it does as little as it can."""
        child = child_preexec()
        prctl = PRCTL
        procs = str(self.cgroup / "cgroup.procs") if self.cgroup is not None else None

        def contain() -> None:
            child()
            joined = False
            if procs is not None:
                # A failure leaves the handler in the daemon's cgroup: it runs, held as a subreaper
                # (`started` sees it and says so), rather than failing its job for the host's sake.
                with contextlib.suppress(OSError):
                    fd = os.open(procs, os.O_WRONLY)
                    try:
                        os.write(fd, b"0")
                        joined = True
                    finally:
                        os.close(fd)
            if not joined and prctl is not None:
                prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

        return contain

    def started(self, leader: int) -> None:
        self._leader = leader
        if self.cgroup is not None and not _joined(leader, self.cgroup):
            # The child could not join (a parent cgroup with controllers enabled, a permission): it made
            # itself a subreaper instead, and the tree is held that way.
            log.warning("handler pid %d could not join its cgroup %s; its tree is held by a subreaper", leader,
                        self.cgroup)  # fmt: skip
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
            self.cgroup = None
        stat = _stat(leader)
        if self.cgroup is None and stat is not None:
            self._members[leader] = stat.start

    def signal(self, signum: signal.Signals, *, besides_group: int) -> None:
        """Send `signum` to every live process of the tree outside process group `besides_group`, which
        the caller signals as a whole: a handler counting SIGTERMs must see one."""
        for pid in self._live():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) != besides_group:
                    os.kill(pid, signum)

    def holds_processes(self) -> bool:
        """True while a process of the tree has not exited (a zombie has)."""
        if self.cgroup is not None:
            try:
                return "populated 1" in (self.cgroup / "cgroup.events").read_text()
            except OSError:
                return False
        return bool(self._live())

    async def kill(self) -> None:
        """SIGKILL every process of the tree. A subtree is stopped first, round by round until nothing
        in it runs: a process killed while it forks would leave its new child to init, out of reach."""
        if self.cgroup is None:
            for _ in range(_FREEZE_ROUNDS):
                running = [pid for pid, state in self._live().items() if state not in "Tt"]
                if not running:
                    break
                for pid in running:
                    _signal(pid, signal.SIGSTOP)
                await asyncio.sleep(_POLL)
        self.kill_now()

    def kill_now(self) -> None:
        """SIGKILL what the tree holds now, without stopping it first (for a teardown that cannot wait)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.kill").write_text("1")
            return
        for pid in self._live():
            _signal(pid, signal.SIGKILL)

    async def wait_empty(self) -> None:
        """Return once every process of the tree has exited; the caller bounds the wait."""
        while True:
            if not self.holds_processes():
                return
            await asyncio.sleep(_POLL)

    def close(self) -> bool:
        """Remove the attempt's cgroup; False if it still holds a process (then it is left in place)."""
        if self.cgroup is None:
            return True
        try:
            self.cgroup.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.warning("cannot remove the handler cgroup %s: %s", self.cgroup, exc)
            return False
        return True

    def _live(self) -> dict[int, str]:
        """pid -> state of each process of the tree that has not exited; in subreaper mode, the subtree
        below every such process is added to the members first."""
        if self.cgroup is not None:
            try:
                pids = [int(pid) for pid in (self.cgroup / "cgroup.procs").read_text().split()]
            except OSError:
                return {}
            return {pid: "R" for pid in pids}
        roots = [pid for pid, start in self._members.items() if _alive(_stat(pid), start)]
        if not roots:
            # The handler and all it was seen to fork have exited: nothing left that /proc can show
            # as theirs, so no scan of /proc (the common case, at the end of every job).
            return {}
        stats = dict(_all_stats())
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat.ppid, []).append(pid)
        live: dict[int, str] = {}
        pending = roots
        while pending:
            pid = pending.pop()
            found = stats.get(pid)
            if found is None or pid in live:
                continue
            if not _alive(found, self._members.setdefault(pid, found.start)):
                continue
            live[pid] = found.state
            pending.extend(children.get(pid, ()))
        return live


def _joined(pid: int, cgroup: Path) -> bool:
    """False when `pid` is known to be outside `cgroup`; True when it is inside, or already gone."""
    try:
        own = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return True
    return any(line.startswith("0::") and line.rstrip().endswith("/" + cgroup.name) for line in own)


def _alive(stat: _Stat | None, start: int) -> bool:
    return stat is not None and stat.start == start and stat.state not in "ZX"
