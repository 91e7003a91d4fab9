"""BatchStatus and the batch hash's reply parsing (no Redis needed)."""

from __future__ import annotations

import pytest

from jobcar import InvalidJob
from jobcar.client import BatchStatus, Client
from jobcar.replies import parse_batch


def test_parse_batch_reads_missing_counters_as_zero() -> None:
    assert parse_batch([b"10", None, b"2", None]) == (10, 0, 2, 0)
    assert parse_batch([None, None, None, None]) == (0, 0, 0, 0)
    with pytest.raises(TypeError):
        parse_batch([b"1"])


def test_pending_and_finished_follow_the_counters() -> None:
    status = BatchStatus("b", "default", total=10, done=6, dead=1, canceled=1)
    assert (status.pending, status.finished) == (2, False)
    assert BatchStatus("b", "default", total=3, done=2, dead=1).finished
    assert BatchStatus("b", "default").finished  # an unknown batch reads as zeros
    assert "pending=2" in str(status)
    assert "'b'" in str(status)


def test_batch_calls_check_their_arguments_before_reaching_redis() -> None:
    client = Client.from_url("redis://127.0.0.1:1/0")  # never connected: every call below fails first
    with pytest.raises(InvalidJob, match="batch id"):
        client.batch_status("has space")
    with pytest.raises(InvalidJob, match="queue name"):
        client.batch_status("b", queue="no/slash")
    with pytest.raises(ValueError, match="poll"):
        client.wait_batch("b", timeout=1, poll=0)
    with pytest.raises(ValueError, match="timeout"):
        client.wait_batch("b", timeout=float("nan"))
    client.close()
