"""The daemon's background loops: named tasks that say how they ended, and steps repeated until cancelled
that survive a bad moment of Redis and log a bug instead of dying of it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from jobcar.redis_link import REDIS_ERRORS, Reachability, RedisLink, RedisUnavailable

log = logging.getLogger("jobcar.loops")


def spawn(name: str, work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> asyncio.Task[None]:
    """Start a named background task; keep a strong reference in `tasks` and log how it ended."""
    task = asyncio.create_task(work, name=name)
    tasks.add(task)

    def done(t: asyncio.Task[None]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("task %s failed", name, exc_info=t.exception())

    task.add_done_callback(done)
    return task


def current_task_cancelling() -> bool:
    """True when the current task was asked to cancel. redis-py sends through `asyncio.wait_for`, which
    on Python 3.11 swallows a cancel landing just as the command completes (the call returns normally),
    so a loop must check for a pending cancel itself or it can run on after shutdown cancelled it."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def forever(name: str, step: Callable[[], Awaitable[None]], reachability: Reachability) -> None:
    """Run `step` in a loop until cancelled. Its calls through RedisLink count and pace their own
    failures; any other Redis error is counted here, and anything else is logged."""
    while True:
        if current_task_cancelling():
            raise asyncio.CancelledError  # a cancel redis-py swallowed (see `current_task_cancelling`)
        try:
            await step()
        except RedisUnavailable:
            pass  # counted and backed off by RedisLink.call
        except REDIS_ERRORS as exc:
            await reachability.failed(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: unexpected error; continuing", name)
            await asyncio.sleep(1)


async def any_exists(link: RedisLink, keys: Sequence[str]) -> bool:
    """Whether any of `keys` exists (of whatever type), in one EXISTS: how an idle daemon's periodic looks
    find that there is nothing to look at for one command, not one script per queue (ADR 0022). On a
    Cluster redis-py sends one EXISTS per slot and adds the counts."""
    if not keys:
        return False
    client = link.client
    found: int = await link.call(lambda: client.exists(*keys))
    return found > 0
