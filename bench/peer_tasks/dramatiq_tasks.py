"""Dramatiq: the Redis broker and actor for `dramatiq peer_tasks.dramatiq_tasks`."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from peer_tasks import REDIS_URL, started

broker = RedisBroker(url=REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor
def noop(payload: dict[str, object]) -> None:
    started(payload)
