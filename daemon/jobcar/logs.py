"""Log lines: one JSON object per line for machines, or a readable line for a terminal.

Fields beyond ts/level/msg come from `extra=` and are limited to a fixed set (FIELDS): nothing else, so
no payload or secret can reach a log line by accident.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Final, TextIO

from jobcar.timestamps import rfc3339

FIELDS: Final = ("queue", "job_id", "type", "attempt", "duration_s", "outcome", "status", "schedule")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{n}={record.__dict__[n]}" for n in FIELDS if record.__dict__.get(n) is not None)
        text = f"{rfc3339(record.created)[11:23]} {record.levelname:<7} {record.getMessage()}"
        if fields:
            text += f"  {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure the "jobcar" logger. `fmt` auto means JSON unless the stream is a terminal."""
    stream = stream or sys.stdout
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if use_json else ConsoleFormatter())
    logger = logging.getLogger("jobcar")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
