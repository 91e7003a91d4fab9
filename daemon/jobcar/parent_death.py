"""`PR_SET_PDEATHSIG` for the processes the daemon starts: the kernel kills a child when the thread that
forked it dies (Linux; nothing elsewhere). Handlers get it (`executors/containment.py`), and so does the
embedded server (`embedded.py`), which is why it lives below both. Standard library only.
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


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGKILL when this daemon (its forking thread) dies.

    None where `prctl` is unavailable (not Linux): pass it as is to `create_subprocess_exec`. Works with
    both the default asyncio loop and uvloop (which runs `preexec_fn` in the child after `fork`).
    """
    prctl = PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # If the daemon died between fork and prctl, the signal was never armed: the child's parent
        # is already someone else, so it must not go on.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm
