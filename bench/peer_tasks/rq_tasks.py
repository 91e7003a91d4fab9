"""RQ: a plain function, imported by dotted path in the work horse."""

from __future__ import annotations

from peer_tasks import started


def noop(payload: dict[str, object]) -> None:
    started(payload)
