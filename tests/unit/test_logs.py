"""Log lines: JSON for machines, readable for terminals, and only the known fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from jobcar.logs import setup_logging


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """setup_logging reconfigures the "jobcar" logger; put it back for the tests that follow."""
    root = logging.getLogger("jobcar")
    saved = (root.handlers[:], root.level, root.propagate)
    yield logging.getLogger("jobcar.test")
    root.handlers[:], root.level, root.propagate = saved


def test_json_lines_carry_the_standard_fields_and_nothing_else(logger: logging.Logger) -> None:
    stream = io.StringIO()  # not a terminal: auto means JSON
    setup_logging("info", "auto", stream)
    logger.info("job %s", "retry", extra={"queue": "q", "job_id": "j", "attempt": 2, "payload": "secret"})
    logger.debug("not at info")
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["msg"] == "job retry"
    assert record["level"] == "info"
    assert record["ts"].endswith("Z")
    assert (record["queue"], record["job_id"], record["attempt"]) == ("q", "j", 2)
    assert "payload" not in record
    assert "secret" not in line


def test_console_format_for_terminals(logger: logging.Logger) -> None:
    stream = io.StringIO()
    setup_logging("debug", "console", stream)
    logger.warning("lease lost", extra={"queue": "q", "job_id": "j"})
    line = stream.getvalue().strip()
    assert "WARNING" in line
    assert "lease lost" in line
    assert "queue=q job_id=j" in line
    assert not line.startswith("{")
