"""huey: the RedisHuey instance for `huey_consumer peer_tasks.huey_tasks.huey`."""

from __future__ import annotations

from huey import RedisHuey

from peer_tasks import REDIS_URL, started

huey = RedisHuey("peers", url=REDIS_URL)


@huey.task()
def noop(payload: dict[str, object]) -> None:
    started(payload)
