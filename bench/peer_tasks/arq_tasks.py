"""arq: an async no-op; `python -m peer_tasks.arq_tasks` runs one worker through arq's own `run_worker`.

arq's CLI would configure INFO logging (two lines per job); the API runner keeps arq's defaults
otherwise (max_jobs 10, poll_delay 0.5 s, results kept 1 h) and logs warnings only.
"""

from __future__ import annotations

import logging
from typing import Any

from arq.connections import RedisSettings
from arq.worker import run_worker

from peer_tasks import REDIS_URL, started


async def noop(ctx: dict[str, Any], payload: dict[str, object]) -> None:
    started(payload)


class WorkerSettings:
    functions = (noop,)
    redis_settings = RedisSettings.from_dsn(REDIS_URL)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run_worker(WorkerSettings)  # type: ignore[arg-type]
