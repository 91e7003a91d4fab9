"""What every process the daemon starts (a handler, the embedded server) does between fork and exec:

- it leaves the daemon's session at once, and drops a terminal signal that reached it before it left: a
  Ctrl-C meant for the daemon (which then drains) must never kill a handler the daemon was starting;
- it gets `PR_SET_PDEATHSIG(SIGKILL)`: the kernel kills it when the thread that forked it dies (Linux;
  nothing elsewhere).

Kept below both the executors and the embedded server. Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Callable[[int, int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[[int, int, int, int, int], int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


#: libc's prctl, or None off Linux. Resolved once in the parent: the child between fork and exec should
#: do as little as possible (no dlopen, no allocation-heavy work).
PRCTL: Final = _load_prctl()


#: The signals a terminal sends its foreground process group (Ctrl-C, Ctrl-\\, Ctrl-Z, a hang-up).
TERMINAL_SIGNALS: Final = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGHUP)


def child_preexec() -> Callable[[], None]:
    """A `preexec_fn` for a process the daemon starts (with `start_new_session=True`, which alone is not
    enough: uvloop runs `preexec_fn` before libuv's `setsid`, and a signal sent to the daemon's group in
    between stays pending, blocked, until just before exec, where it kills the child). Works with both the
    default asyncio loop and uvloop (which runs `preexec_fn` in the child after `fork`)."""
    prctl = PRCTL
    parent = os.getpid()

    def start() -> None:
        if os.getsid(0) != os.getpid():
            os.setsid()  # out of the terminal's process group: no terminal signal reaches it from now on
        # Take any terminal signal still pending (blocked since the fork) so that it never arrives; exec
        # then gives the program the default handlers.
        while signal.sigtimedwait(TERMINAL_SIGNALS, 0) is not None:
            pass
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # If the daemon died between fork and prctl, the signal was never armed: the child's parent
            # is already someone else, so it must not go on.
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    return start
