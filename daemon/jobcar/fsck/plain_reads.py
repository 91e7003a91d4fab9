"""The plain reads fsck's reading is made of: the keys a SCAN finds, pipelines sent a chunk at a time, the keys
that hold another Redis type than jobcar writes there (`Mistyped`), a SET's members or a HASH's fields (a key of
another type read as empty, as the scripts pass over it), and Redis's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from redis.exceptions import ResponseError

from jobcar.replies import as_text, time_ms
from jobcar.transport import AsyncRedis

SCAN_COUNT: Final = 1000
_CHUNK: Final = 500


@dataclass(frozen=True, slots=True)
class Mistyped:
    """A key that holds another Redis type than jobcar writes there."""

    key: str
    holds: str
    expected: str


async def scan(client: AsyncRedis, pattern: str) -> list[str]:
    return sorted({as_text(k) async for k in client.scan_iter(match=pattern, count=SCAN_COUNT)})


def chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


async def mistyped_keys(client: AsyncRedis, expected: Mapping[str, str]) -> list[Mistyped]:
    """The keys of `expected` that hold neither nothing nor the type it names for them."""
    mistyped: list[Mistyped] = []
    for chunk in chunks(list(expected)):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.type(key)
        for key, holds in zip(chunk, (as_text(t) for t in await pipe.execute()), strict=True):
            if holds not in ("none", expected[key]):
                mistyped.append(Mistyped(key, holds, expected[key]))
    return mistyped


async def set_members(client: AsyncRedis, key: str) -> set[bytes | str]:
    """A SET's members; a key of another type reads as empty (the scripts pass over it the same way)."""
    try:
        members: set[bytes | str] = await client.smembers(key)
    except ResponseError:
        return set()
    return members


async def hash_fields(client: AsyncRedis, key: str) -> list[bytes | str]:
    """A HASH's fields; a key of another type reads as empty (the scripts pass over it the same way)."""
    try:
        fields: list[bytes | str] = await client.hkeys(key)
    except ResponseError:
        return []
    return fields


async def redis_now_ms(client: AsyncRedis) -> int:
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")
    return time_ms((await pipe.execute())[0])
