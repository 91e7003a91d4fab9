"""The process exit codes of `jobcar` and its commands (sysexits.h where one fits)."""

from __future__ import annotations

from typing import Final

EX_OK: Final = 0
EX_FAILURE: Final = 1
EX_USAGE: Final = 2
EX_UNAVAILABLE: Final = 69  # Redis (or the embedded server) cannot be reached
EX_TEMPFAIL: Final = 75  # a queue at its max_pending refused the enqueue (ADR 0024): try again later
EX_CONFIG: Final = 78  # the config, or the server's settings under `redis.strict`, refuse the start
