"""Running the migration of key layouts (jobcar.migrate, asyncio) from the tests' synchronous clients."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis
import redis.asyncio

from jobcar import migrate
from jobcar.keys import QueueKeys, layout_key
from jobcar.transport import AsyncRedis
from tests.integration.driver import QueueDriver

T = TypeVar("T")


def run_async(client: redis.Redis | redis.RedisCluster, work: Callable[[AsyncRedis], Awaitable[T]]) -> T:
    """`work` on an asyncio client of the same server (or Cluster) as `client`, in an event loop of its own."""

    async def main() -> T:
        twin: AsyncRedis
        if isinstance(client, redis.RedisCluster):
            node = client.get_default_node()
            twin = redis.asyncio.RedisCluster(host=node.host, port=node.port)
        else:
            options = client.connection_pool.connection_kwargs
            twin = redis.asyncio.Redis(host=options["host"], port=options["port"])
        try:
            return await work(twin)
        finally:
            await twin.aclose()

    return asyncio.run(main())


def as_layout_2(q: QueueDriver, *queues: str) -> None:
    """The namespace as daemons of layout 2 leave it: the layout recorded, and no pending counts in `queues`
    (they kept none)."""
    q.redis.set(layout_key(q.namespace), 2)
    for queue in queues:
        q.redis.delete(QueueKeys.of(q.namespace, queue).pending_counts)


def migrate_layout(q: QueueDriver) -> migrate.Migrated:
    """`jobcar migrate` on the driver's namespace."""
    return run_async(q.redis, lambda client: migrate.migrate(client, q.namespace))
