"""The app's health gates leasing: while the app's health URL fails, jobs wait in Redis instead of
burning attempts against an app that is starting, restarting or overloaded.

One probe task per distinct URL asks it every PROBE_INTERVAL; a 2xx answer within PROBE_TIMEOUT is
healthy, anything else (refused, timeout, 5xx) is not. A URL starts unhealthy until its first 2xx,
because a sidecar usually starts before its app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final, Protocol

import aiohttp

log = logging.getLogger("jobcar.app_health")

PROBE_INTERVAL: Final = 1.0
PROBE_TIMEOUT: Final = 2.0


class HealthGate(Protocol):
    """The app's health, by URL; None stands for "no health URL": always healthy."""

    def healthy(self, url: str | None) -> bool: ...

    async def wait(self, url: str | None) -> None: ...


class AlwaysHealthy:
    """The gate of a daemon without a health URL (and of tests that run jobs in-process)."""

    def healthy(self, url: str | None) -> bool:
        return True

    async def wait(self, url: str | None) -> None:
        return None


class AppHealth:
    """Probes the app's health URLs (a HealthGate)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self._healthy: dict[str, asyncio.Event] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}

    def watch(self, urls: Iterable[str | None]) -> None:
        """Probe these URLs (None is ignored); URLs no longer listed stop being probed."""
        wanted = {u for u in urls if u}
        for url in set(self._probes) - wanted:
            self._probes.pop(url).cancel()
        for url in wanted - set(self._probes):
            self._healthy.setdefault(url, asyncio.Event())
            self._probes[url] = asyncio.create_task(self._probe(url), name=f"health {url}")

    def healthy(self, url: str | None) -> bool:
        return url is None or (url in self._healthy and self._healthy[url].is_set())

    async def wait(self, url: str | None) -> None:
        if url is not None:
            await self._healthy.setdefault(url, asyncio.Event()).wait()

    async def close(self) -> None:
        for task in self._probes.values():
            task.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()

    async def _probe(self, url: str) -> None:
        event = self._healthy[url]
        while True:
            ok, detail = await self._ask(url)
            if ok and not event.is_set():
                log.info("app healthy: %s; leasing its jobs", url)
                event.set()
            elif not ok and event.is_set():
                log.warning("app unhealthy: %s (%s); its jobs wait in Redis", url, detail)
                event.clear()
            await asyncio.sleep(PROBE_INTERVAL)

    async def _ask(self, url: str) -> tuple[bool, str]:
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT)) as response:
                return 200 <= response.status < 300, f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return False, type(exc).__name__
