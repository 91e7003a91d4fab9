"""One place tests make jobs and handler programs: a `Job` as a leased one looks (for executors run
in-process), and handler programs written to a file (for command handlers and `jobcar run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from jobcar.job import Job, State

#: When the jobs made here were enqueued: a fixed instant, so headers and variables derived from it are known.
CREATED_MS = 1_700_000_000_123


def make_job(payload: bytes = b"", **fields: Any) -> Job:
    """A job in its first active attempt; any field of `Job` can be given."""
    values: dict[str, Any] = {"id": "job-1", "queue": "default", "type": "t", "payload": payload,
                              "state": State.ACTIVE, "attempt": 1, "created_ms": CREATED_MS}  # fmt: skip
    return Job(**{**values, **fields})


def program(directory: Path, name: str, text: str) -> str:
    """`text` (with its own #! line) as an executable file; its path."""
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def python_handler(directory: Path, name: str, body: str) -> list[str]:
    """A Python handler program whose `body` has `os` and `sys` imported; the argv that runs it."""
    path = directory / name
    path.write_text(f"import os, sys\n{body}\n")
    return [sys.executable, str(path)]
