"""A handler's whole process tree ends with its job and with its daemon, even a descendant that left the
handler's process group and session (ADR 0011; guarantees 1 and 10 of docs/delivery-semantics.md).

The handler here daemonizes the classic way: it forks, the child forks again and exits at once, and the
grandchild calls setsid(), ignores SIGTERM and sleeps. Killing the handler's process group cannot reach
that grandchild; only containing the tree can. "Gone" is `is_gone`: no /proc entry or a zombie.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from jobcar.executors.command import CommandExecutor
from jobcar.executors.containment import ProcessTree, _CgroupParent
from jobcar.outcome import OutcomeKind
from tests.integration.test_command_executor import (
    BOTH_LOOPS,
    a_guarded_daemon_running,
    eventually,
    is_gone,
    make_handler,
    make_job,
    read_pids,
    script,
)
from tests.servers import wait_for

# Publishes "<handler pid> <grandchild pid>" once the grandchild runs in a session of its own; then the
# handler exits at once (EXIT_AFTER_ESCAPE set) or sleeps like a slow job. Everything ignores SIGTERM.
ESCAPING = f"""#!{sys.executable}
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
handler = os.getpid()
path = os.environ["PIDS_FILE"]
child = os.fork()
if child == 0:
    if os.fork() == 0:
        os.setsid()
        with open(path + ".tmp", "w") as f:
            f.write(f"{{handler}} {{os.getpid()}}")
        os.rename(path + ".tmp", path)
        while True:
            time.sleep(1)
    os._exit(0)
os.waitpid(child, 0)
while not os.path.exists(path):
    time.sleep(0.01)
if os.environ.get("EXIT_AFTER_ESCAPE"):
    print("left a daemon behind")
    raise SystemExit(0)
while True:
    time.sleep(1)
"""


def escaped(handler: int, grandchild: int) -> bool:
    """The grandchild runs in a session (and so a process group) of its own, away from the handler's."""
    return os.getsid(grandchild) == grandchild and os.getpgid(grandchild) != handler


def cgroup_of(pid: int) -> str:
    """The process's cgroup v2 path, from /proc."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line[3:] for line in lines if line.startswith("0::"))


@BOTH_LOOPS
@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroup", "subreaper"])
async def test_a_timeout_kills_a_setsid_grandchild_that_ignores_sigterm(
    use_cgroups: bool, tmp_path: Path, pids_file: Path
) -> None:
    handler = make_handler(script(tmp_path, ESCAPING), timeout=3.0, kill_grace=0.5, env={"PIDS_FILE": str(pids_file)})
    executor = CommandExecutor(handler, None, use_cgroups=use_cgroups)
    task = asyncio.create_task(executor.run(make_job(), deadline=time.time() + 60, max_attempts=5))
    await eventually(pids_file.exists, what="the grandchild's pid")
    leader, grandchild = read_pids(pids_file)
    assert escaped(leader, grandchild), "the grandchild left the handler's session"
    if use_cgroups:
        assert "/jobcar-" in cgroup_of(grandchild), "this machine lets the daemon create cgroups (ADR 0011)"
    outcome = await task
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error is not None
    assert outcome.error.startswith("timeout after 3.0s"), outcome.error
    # The attempt ended only once the whole tree was dead: nothing to wait for beyond signal delivery.
    wait_for(lambda: is_gone(grandchild), timeout=1, what="the setsid()'d grandchild to be gone")
    assert is_gone(leader)


async def test_cancelling_the_run_kills_a_setsid_grandchild(tmp_path: Path, pids_file: Path) -> None:
    handler = make_handler(script(tmp_path, ESCAPING), kill_grace=0.5, env={"PIDS_FILE": str(pids_file)})
    task = asyncio.create_task(
        CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    )
    await eventually(pids_file.exists, what="the grandchild's pid")
    leader, grandchild = read_pids(pids_file)
    assert escaped(leader, grandchild)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    wait_for(lambda: is_gone(grandchild), timeout=1, what="the setsid()'d grandchild to be gone")
    assert is_gone(leader)


async def test_a_daemon_left_behind_by_a_handler_that_exited_is_killed(tmp_path: Path, pids_file: Path) -> None:
    handler = make_handler(script(tmp_path, ESCAPING), env={"PIDS_FILE": str(pids_file), "EXIT_AFTER_ESCAPE": "1"})
    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    assert outcome.result == b"left a daemon behind\n"
    _, grandchild = read_pids(pids_file)
    wait_for(lambda: is_gone(grandchild), timeout=1, what="the setsid()'d grandchild to be gone")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_setsid_grandchild_dies_with_a_sigkilled_daemon(loop: str, tmp_path: Path, pids_file: Path) -> None:
    with a_guarded_daemon_running(tmp_path, ESCAPING, pids_file, loop) as daemon:
        leader, grandchild = daemon.leader, daemon.other
        assert escaped(leader, grandchild)
        daemon.process.kill()
        daemon.process.wait(timeout=10)
        wait_for(lambda: is_gone(grandchild), timeout=5, what="the setsid()'d grandchild to die with the daemon")
        wait_for(lambda: is_gone(leader), timeout=5, what="the handler to die with the daemon")
        wait_for(lambda: is_gone(daemon.guardian), timeout=5, what="the guardian to exit")


def test_a_cgroup_name_left_by_an_earlier_daemon_with_this_pid_is_skipped() -> None:
    """A restarted container's daemon often has the pid its predecessor had: that one's empty cgroups must
    not turn containment off (mkdir's EEXIST), nor be reused."""
    parent = _CgroupParent()
    first = parent.create()
    assert first is not None, "this machine lets the daemon create cgroups (ADR 0011)"
    taken = first.parent / f"jobcar-{os.getpid()}-2"
    taken.mkdir()
    try:
        second = parent.create()
        assert second is not None, "containment stays on"
        assert second.name == f"jobcar-{os.getpid()}-3"
        second.rmdir()
    finally:
        taken.rmdir()
        first.rmdir()


async def test_a_handler_that_cannot_join_its_cgroup_is_held_as_a_subreaper(
    tmp_path: Path, pids_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its write to cgroup.procs fails (here: a directory that is no cgroup). It becomes a subreaper instead,
    the tree says so, and a setsid()'d grandchild is still found and killed."""
    not_a_cgroup = tmp_path / "jobcar-not-a-cgroup"
    not_a_cgroup.mkdir()
    tree = ProcessTree(not_a_cgroup)
    handler = await asyncio.create_subprocess_exec(
        script(tmp_path, ESCAPING), env={**os.environ, "PIDS_FILE": str(pids_file)}, preexec_fn=tree.preexec()
    )
    try:
        with caplog.at_level(logging.WARNING):
            tree.started(handler.pid)
        assert tree.cgroup is None
        assert "could not join its cgroup" in caplog.text
        await eventually(pids_file.exists, what="the grandchild's pid")
        leader, grandchild = read_pids(pids_file)
        assert escaped(leader, grandchild)
        await tree.kill()
        await asyncio.wait_for(tree.wait_empty(), 10)
        assert is_gone(grandchild)
    finally:
        with contextlib.suppress(ProcessLookupError):
            handler.kill()
        await handler.wait()
