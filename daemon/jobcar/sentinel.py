"""Clients of the primary that a Redis Sentinel group names, built from a `redis+sentinel://` URL for the
daemon, the CLI, the client and the Spark helper alike.

redis-py's Sentinel connections ask the sentinels for the primary's address each time they connect, and
drop themselves when the server they reach answers READONLY (a primary demoted by a failover): after
a failover, a call fails once with a ConnectionError, like any outage, and the next connection reaches
the new primary. Each client carries the URL's `ReplicaWait`, which producers send with their enqueues.

Only the standard library and redis-py are imported: the producer client builds these.
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from jobcar.redis_url import SentinelURL, parse_sentinel_url
from jobcar.transport import ReplicaWait

#: The caller's options that also apply to the connections to the sentinels.
_SENTINEL_CONNECTION_OPTIONS = ("socket_timeout", "socket_connect_timeout", "retry", "protocol")


class SentinelRedis(redis.Redis):
    """A client of a Sentinel group's primary; closing it closes its connections to the sentinels too."""

    # Not `sentinel`: that is the client's SENTINEL command.
    sentinel_group: redis.sentinel.Sentinel | None = None
    replica_wait: ReplicaWait | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.sentinel_group is not None:
                self.sentinel_group.close()


class AsyncSentinelRedis(redis.asyncio.Redis):
    """`SentinelRedis` for redis.asyncio."""

    sentinel_group: redis.asyncio.sentinel.Sentinel | None = None
    replica_wait: ReplicaWait | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            if self.sentinel_group is not None:
                await self.sentinel_group.aclose()


def sentinel_client(url: str, **options: Any) -> SentinelRedis:
    """A client of the primary that `url` names; `options` (socket timeouts, retry, protocol...) apply to
    its connections, and the socket timeouts, retry and protocol to the sentinels' too. ValueError for a
    bad URL."""
    target = parse_sentinel_url(url)
    server, sentinels = _connection_options(target, options)
    group = redis.sentinel.Sentinel(target.sentinels, sentinel_kwargs=sentinels)  # type: ignore[no-untyped-call]
    client = cast(SentinelRedis, group.master_for(target.service_name, redis_class=SentinelRedis, **server))  # type: ignore[no-untyped-call]
    client.sentinel_group, client.replica_wait = group, _replica_wait(target)
    return client


def async_sentinel_client(url: str, **options: Any) -> AsyncSentinelRedis:
    """`sentinel_client` for redis.asyncio."""
    target = parse_sentinel_url(url)
    server, sentinels = _connection_options(target, options)
    group = redis.asyncio.sentinel.Sentinel(target.sentinels, sentinel_kwargs=sentinels)  # type: ignore[no-untyped-call]
    client = cast(AsyncSentinelRedis, group.master_for(target.service_name, redis_class=AsyncSentinelRedis, **server))
    client.sentinel_group, client.replica_wait = group, _replica_wait(target)
    return client


def replica_wait_of(client: object) -> ReplicaWait | None:
    """The WAIT a producer sends behind its enqueues through `client`: its Sentinel URL's, else none."""
    if isinstance(client, (SentinelRedis, AsyncSentinelRedis)):
        return client.replica_wait
    return None


def _replica_wait(target: SentinelURL) -> ReplicaWait | None:
    return ReplicaWait(target.wait_replicas, target.wait_timeout_ms) if target.wait_replicas else None


def _connection_options(target: SentinelURL, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the servers' connection options, the sentinels')."""
    tls: dict[str, Any] = {"ssl": True, **target.tls_options} if target.tls else {}
    # What the URL says wins over `options`, as in redis-py's from_url; credentials it omits do not.
    credentials = {"username": target.username, "password": target.password}
    server = {**options, "db": target.db, **{k: v for k, v in credentials.items() if v is not None}, **tls}
    sentinels = {name: options[name] for name in _SENTINEL_CONNECTION_OPTIONS if name in options}
    sentinels.update(username=target.sentinel_username, password=target.sentinel_password, **tls)
    return server, sentinels
