"""A terminal's signals are the daemon's, never a handler's: a Ctrl-C that lands while the daemon is starting a
handler must not kill it (its job would spend an attempt). Between fork and exec the child is still in the
daemon's process group, where the terminal's signals go; libuv (uvloop) blocks signals there and unblocks
them just before exec, so one that came meanwhile arrives then, with the default action. `child_preexec`,
which every process the daemon starts runs first, leaves the group and drops such a signal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A child forked with SIGINT blocked, as libuv forks, gets a SIGINT sent to its group before its
#: `preexec_fn` runs; then, as libuv does before exec, SIGINT is set to its default and unblocked. The child
#: prints whether it is in a session of its own and exits 0, unless the SIGINT killed it.
FORKED = textwrap.dedent(
    """
    import os, signal, sys
    from jobcar.child_process import child_preexec

    start = child_preexec() if sys.argv[1] == "with" else (lambda: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:
        os.killpg(os.getpgid(0), signal.SIGINT)  # the terminal's Ctrl-C, to the daemon's group
        start()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        print("own session" if os.getsid(0) == os.getpid() else "daemon's session", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
    """
)


def forked(preexec: str) -> list[str]:
    # A session of its own for the script, so that the SIGINT reaches only it and its child (which it
    # blocks, then takes: the parent itself is never interrupted).
    done = subprocess.run(
        [sys.executable, "-c", FORKED, preexec],
        env={"PYTHONPATH": str(ROOT / "daemon"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_sigint_to_the_daemons_group_before_exec_never_reaches_the_program() -> None:
    assert forked("with") == ["own session", "exit 0"]


def test_without_it_the_sigint_kills_the_child_at_exec() -> None:
    """What the test above guards against, shown on the same script: the check cannot pass by accident."""
    assert forked("without") == ["signal 2"]
