"""Job.from_hash: the daemon decodes every leased job with it, and readers of any hash use it too."""

from __future__ import annotations

import pytest

from jobcar.job import Job, State


def test_every_stored_state_reads_back_and_a_missing_one_reads_as_pending() -> None:
    for state in State:
        assert Job.from_hash("j", "q", {b"type": b"t", b"state": state.value.encode()}).state is state
    assert Job.from_hash("j", "q", {b"type": b"t"}).state is State.PENDING
    assert Job.from_hash("j", "q", {b"type": b"t", b"state": b""}).state is State.PENDING


def test_an_unknown_state_is_a_value_error_naming_it() -> None:
    # ValueError is what the lease parser turns into "malformed job" and the CLI into a readable error.
    with pytest.raises(ValueError, match="'activ'"):
        Job.from_hash("j", "q", {b"type": b"t", b"state": b"activ"})
