"""Command packing in C for the daemon's asyncio Redis connections.

redis-py's synchronous connections pack commands with hiredis when it is installed; its asyncio ones
always pack in Python, one bytes join per argument. The daemon's merged acks carry five arguments per
job, and packing them in Python was a measurable share of the daemon's CPU per job (ADR 0006).

Only arguments whose wire form both packers agree on take the C path: str, bytes and int (not bool,
which redis-py refuses), after a command name (str or bytes) without spaces: redis-py splits
"SCRIPT LOAD" into two arguments. Anything else goes to redis-py's own packing, errors included.
"""

from __future__ import annotations

from typing import Any, Final

import hiredis
import redis.asyncio
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection

_PLAIN_TYPES: Final = frozenset({str, bytes, int})


class _HiredisPacking(AbstractConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        plain_head = (type(head) is str and " " not in head) or (type(head) is bytes and b" " not in head)
        if plain_head and all(type(arg) in _PLAIN_TYPES for arg in args):
            packed: bytes = hiredis.pack_command(args)
            return [packed]
        return super().pack_command(*args)


class HiredisConnection(_HiredisPacking, Connection):
    pass


class HiredisSSLConnection(_HiredisPacking, SSLConnection):
    pass


class HiredisUnixDomainSocketConnection(_HiredisPacking, UnixDomainSocketConnection):
    pass


_REPLACEMENTS: Final[dict[type[AbstractConnection], type[AbstractConnection]]] = {
    Connection: HiredisConnection,
    SSLConnection: HiredisSSLConnection,
    UnixDomainSocketConnection: HiredisUnixDomainSocketConnection,
}


def use_hiredis_packing(client: redis.asyncio.Redis) -> None:
    """Make the connections `client`'s pool opens from now on pack with hiredis (redis://, rediss:// and
    unix:// alike; the pool picked the class from the URL). A class it does not know is left alone."""
    pool = client.connection_pool
    pool.connection_class = _REPLACEMENTS.get(pool.connection_class, pool.connection_class)
