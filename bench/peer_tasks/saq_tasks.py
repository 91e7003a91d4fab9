"""SAQ: an async no-op and the settings dict for `saq peer_tasks.saq_tasks.settings`."""

from __future__ import annotations

from typing import Any

from saq import Queue

from peer_tasks import REDIS_URL, started


async def noop(ctx: dict[str, Any], *, payload: dict[str, object]) -> None:
    started(payload)


settings: dict[str, Any] = {"queue": Queue.from_url(REDIS_URL), "functions": [noop], "concurrency": 10}
