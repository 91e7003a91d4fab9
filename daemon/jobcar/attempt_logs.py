"""Writing a running job's log: the lines its handler sends through the handler API, and a command's stderr
lines when its handler has `log_stderr`. Lines are cut to `max_line_bytes`; the log keeps the newest
`max_log_lines` and `max_log_bytes` (lua/log.lua drops the oldest and counts them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from jobcar.attempt_desk import LiveAttempt
from jobcar.config_types import HandlerApiSettings
from jobcar.handler_calls import LogReply, log_call, log_entry, now_ms, parse_log
from jobcar.redis_link import REDIS_ERRORS
from jobcar.transport import AsyncRedis, execute_async

log = logging.getLogger("jobcar.attempt_logs")


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

    def forward(self, live: LiveAttempt) -> Callable[[list[str]], None]:
        """A sink for a command's stderr lines: written in order, in the background, while the attempt runs. A
        line that cannot be written (Redis away, the lease lost) is dropped: stderr's tail is still the
        error of a failed attempt."""
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        writer: asyncio.Task[None] | None = None

        async def drain() -> None:
            while not queue.empty():
                lines = queue.get_nowait()
                try:
                    await self.write(live, lines)
                except REDIS_ERRORS as exc:
                    log.debug("stderr lines not logged: %s", exc, extra={"job_id": live.job.id})

        def sink(lines: list[str]) -> None:
            nonlocal writer
            if not lines:
                return
            queue.put_nowait(lines)
            if writer is None or writer.done():
                writer = asyncio.create_task(drain(), name=f"stderr of {live.job.id}")

        return sink
