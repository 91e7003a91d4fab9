"""Which Redis errors are a refusal (Redis answered "no": logged once, paced, still reachable) and which an
outage (backoff, "unreachable"): redis_link.is_refusal, ADR 0008."""

from __future__ import annotations

import pytest
import redis.exceptions as e

from jobcar.redis_link import is_refusal


@pytest.mark.parametrize(
    "error",
    [
        e.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        e.ResponseError("WRONGTYPE jobcar: ns:{q}:active holds a string, not a zset; jobcar fsck finds it"),
        e.NoPermissionError("this user has no permissions to run the 'info' command"),
        e.ResponseError("ERR user_script:1: Script attempted to access nonexistent global variable"),
    ],
)
def test_an_answer_that_says_no_is_a_refusal(error: Exception) -> None:
    assert is_refusal(error)


@pytest.mark.parametrize(
    "error",
    [
        e.ConnectionError("Connection refused"),
        e.TimeoutError("Timeout reading from socket"),
        OSError("unreachable"),
        TimeoutError(),
        e.ReadOnlyError("You can't write against a read only replica."),
        e.BusyLoadingError("Redis is loading the dataset in memory"),
        e.ClusterDownError("The cluster is down"),
        e.TryAgainError("Multiple keys request during rehashing of slot"),
        e.MovedError("3999 127.0.0.1:6381"),
        e.AskError("3999 127.0.0.1:6381"),
        e.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT."),
        e.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
    ],
)
def test_an_error_that_passes_with_time_is_an_outage(error: Exception) -> None:
    assert not is_refusal(error)
