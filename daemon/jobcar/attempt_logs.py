"""Writing a running job's log: the lines its handler sends through the handler API, and a command's stderr
lines when its handler has `log_stderr`. Lines are cut to `max_line_bytes`; the log keeps the newest
`max_log_lines` and `max_log_bytes` (lua/log.lua drops the oldest and counts them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from jobcar.attempt_desk import LiveAttempt
from jobcar.config_types import HandlerApiSettings
from jobcar.handler_calls import LogReply, log_call, log_entry, now_ms, parse_log
from jobcar.redis_link import REDIS_ERRORS
from jobcar.transport import AsyncRedis, execute_async

log = logging.getLogger("jobcar.attempt_logs")

#: The most lines one log write carries (lua/log.lua pushes them in one command, within Lua's stack).
LINES_PER_WRITE: Final = 1000


def cut(line: str, limit: int) -> str:
    """`line` within `limit` bytes of UTF-8, cut at a character and marked with "…" when cut."""
    data = line.encode()
    if len(data) <= limit:
        return line
    return data[: max(0, limit - 3)].decode("utf-8", errors="ignore") + "…"


class LogWriter:
    def __init__(self, client: AsyncRedis, settings: HandlerApiSettings) -> None:
        self.client = client
        self.settings = settings

    async def write(self, live: LiveAttempt, lines: Sequence[str]) -> LogReply:
        """Append `lines` to the job's log, fenced by the attempt's lease (raises Redis's errors)."""
        settings = self.settings
        at = now_ms()
        entries = [log_entry(live.job.attempt, cut(line, settings.max_line_bytes), at) for line in lines]
        call = log_call(live.keys, live.job.id, live.lease_token, entries, settings.max_log_lines,
                        settings.max_log_bytes)  # fmt: skip
        (reply,) = await execute_async(self.client, [call])
        return parse_log(reply)

    def forward(self, live: LiveAttempt) -> StderrLines:
        """Where a command's stderr lines go while the attempt runs (`log_stderr`)."""
        return StderrLines(self, live)


class StderrLines:
    """A command's stderr lines on their way to the job's log: written in order, in the background, and all
    written (`flush`) before the attempt records how it ended, while its lease still fences the writes. A line
    that cannot be written (Redis away, the lease lost) is dropped: stderr's tail is still the error of a failed
    attempt."""

    def __init__(self, writer: LogWriter, live: LiveAttempt) -> None:
        self._writer = writer
        self._live = live
        self._queue: asyncio.Queue[list[str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def add(self, lines: list[str]) -> None:
        if not lines:
            return
        self._queue.put_nowait(lines)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=f"stderr of {self._live.job.id}")

    async def flush(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while not self._queue.empty():
            lines = self._queue.get_nowait()
            try:
                # A chunk of stderr may hold many short lines: a script call takes a bounded number.
                for start in range(0, len(lines), LINES_PER_WRITE):
                    await self._writer.write(self._live, lines[start : start + LINES_PER_WRITE])
            except REDIS_ERRORS as exc:
                log.debug("stderr lines not logged: %s", exc, extra={"job_id": self._live.job.id})
