"""The producer client's validation: every bad job is an InvalidJob with a message that says what to fix."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobcar import InvalidJob, PayloadTooLarge
from jobcar.names import ID_PATTERN
from jobcar.records import IDS_PER_DRAW, build_record, build_records, encode_payload, new_job_id

MIB = 1024 * 1024


def test_json_payload_is_compact_utf8_and_default_content_type_is_not_stored() -> None:
    record = build_record("email.welcome", {"name": "Zoë", "n": [1, 2]}, MIB)
    assert record.payload == '{"name":"Zoë","n":[1,2]}'.encode()
    assert record.content_type is None
    assert record.queue == "default"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_payload_encodes_as_the_standard_library_does(value: object) -> None:
    # The client calls json's C encoder directly (a per-job cost); the bytes must be what json.dumps gives.
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    assert encode_payload(value, None, MIB) == (expected, None)


def test_self_referring_payload_is_an_invalid_job() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidJob, match="payload is not JSON-serialisable: it refers to itself"):
        build_record("t", loop, MIB)
    with pytest.raises(InvalidJob, match="payload is not JSON-serialisable: Object of type set"):
        build_record("t", {"a": {1}}, MIB)


def test_bytes_payload_is_raw_with_a_content_type() -> None:
    assert encode_payload(b"\x00\x01", None, MIB) == (b"\x00\x01", "application/octet-stream")
    assert encode_payload(b"<a/>", "text/xml", MIB) == (b"<a/>", "text/xml")
    assert encode_payload(b'{"pre":1}', "application/json", MIB) == (b'{"pre":1}', None)


def test_delay_run_at_and_durations() -> None:
    assert build_record("t", None, MIB, delay=timedelta(seconds=1.5)).delay_ms == 1500
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert build_record("t", None, MIB, run_at=at).run_at_ms == int(at.timestamp() * 1000)
    assert build_record("t", None, MIB, run_at=1_900_000_000).run_at_ms == 1_900_000_000_000
    assert build_record("t", None, MIB, timeout=30).timeout_ms == 30_000


def test_unique_for_alone_derives_the_key_from_type_and_payload() -> None:
    a = build_record("t", {"x": 1}, MIB, unique_for=60)
    b = build_record("t", {"x": 1}, MIB, unique_for=60)
    c = build_record("t", {"x": 2}, MIB, unique_for=60)
    assert a.unique_key == b.unique_key != c.unique_key
    assert a.unique_ttl_ms == 60_000


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (("", None), {}, "invalid job type ''"),
        (("has space", None), {}, "invalid job type"),
        (("t", None), {"queue": "a{b}"}, "invalid queue name"),
        (("t", None), {"queue": "x" * 101}, "invalid queue name"),
        (("t", object()), {}, "payload is not JSON-serialisable"),
        (("t", float("nan")), {}, "payload is not JSON-serialisable"),
        (("t", {"a": 1}), {"content_type": "text/plain"}, "needs a bytes payload"),
        (("t", None), {"delay": 1, "run_at": 2}, "give delay or run_at, not both"),
        (("t", None), {"delay": -1}, "delay must be a finite number of seconds"),
        (("t", None), {"delay": float("inf")}, "delay must be a finite number of seconds"),
        (("t", None), {"delay": float("nan")}, "delay must be a finite number of seconds"),
        (("t", None), {"delay": 10**12}, "delay must be a finite number of seconds"),
        (("t", None), {"delay": "soon"}, "delay: invalid duration 'soon'"),
        (("t", None), {"delay": "-5s"}, "delay: duration must not be negative"),
        (("t", None), {"delay": [10]}, "delay must be seconds (a number), a duration"),
        (("t", None), {"run_at": "10s"}, "run_at must be seconds (a number)"),
        (("t", None), {"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        (("t", None), {"unique_key": "k"}, "unique_key needs unique_for"),
        (("t", None), {"unique_for": 0}, "unique_for must be positive"),
        (("t", None), {"max_attempts": 0}, "max_attempts must be a positive integer"),
        (("t", None), {"max_attempts": 2.5}, "max_attempts must be a positive integer"),
        (("t", None), {"timeout": 0}, "timeout must be positive"),
        (("t", None), {"job_id": "a b"}, "invalid job_id"),
        (("t", None), {"job_id": "x" * 201}, "invalid job_id"),
        (("t", None), {"traceparent": "nope"}, "not a W3C trace context"),
        (("t", None), {"meta": {"a": 1}}, "meta must be a mapping of strings"),
        (("t", None), {"urgency": 1}, "unknown enqueue option(s): urgency"),
        (("t", None), {"priority": 10}, "priority must be a whole number from 0 (first, the default) to 9, got 10"),
        (("t", None), {"priority": True}, "priority must be a whole number"),
        (("t", None), {"key": ""}, "key must be 1 to 200 characters without control characters"),
        (("t", None), {"key": "a\nb"}, "key must be 1 to 200 characters"),
        (("t", None), {"key": "k" * 201}, "key must be 1 to 200 characters"),
        (("t", None), {"key": 7}, "key must be 1 to 200 characters"),
        (("t", None), {"expires_in": "1m", "expires_at": 1}, "give expires_in or expires_at, not both"),
        (("t", None), {"expires_in": "1m", "delay": "2m"}, "expires_in must be longer than delay"),
        (("t", None), {"unique_mode": "window"}, "unique_mode must be one of until_done, window, with unique_for"),
        (("t", None), {"unique_mode": "forever", "unique_for": 5}, "unique_mode must be one of"),
        (("t", None), {"debounce_key": "k"}, "debounce_key and debounce_max_wait need debounce"),
        (("t", None), {"debounce": "5s", "delay": 1}, "give it without delay"),
        (("t", None), {"debounce": "5s", "unique_for": 1}, "give it without unique_for"),
        (("t", None), {"debounce": "5s", "debounce_max_wait": "1s"}, "debounce_max_wait must be at least debounce"),
        (("t", None), {"debounce": 0}, "debounce must be positive"),
    ],
)
def test_invalid_jobs_are_rejected_with_a_clear_message(
    args: tuple[str, object], options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidJob, match=re.escape(message)):
        build_record(*args, MIB, **options)


def test_payload_limit() -> None:
    build_record("t", b"x" * 100, 100)
    with pytest.raises(PayloadTooLarge, match="101 bytes, over the limit of 100 bytes"):
        build_record("t", b"x" * 101, 100)


def test_enqueue_many_names_the_bad_item() -> None:
    with pytest.raises(InvalidJob, match=r"job #1: invalid job type"):
        build_records([("ok", 1), ("bad type", 2)], MIB)
    with pytest.raises(InvalidJob, match=r"job #0: expected \(type, payload\)"):
        build_records([("only-type",)], MIB)  # type: ignore[list-item]


def test_job_ids_are_short_and_unique() -> None:
    ids = {new_job_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(len(i) == 20 and ID_PATTERN.fullmatch(i) and not i.startswith("-") for i in ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    # Ids are drawn IDS_PER_DRAW at a time; a child forked with spares left (a Spark Python worker) must
    # not hand out the ones its parent will.
    new_job_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the ids it would give, then leave without running pytest's exit
        os.write(write, " ".join(new_job_id() for _ in range(IDS_PER_DRAW)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    assert len(child) == IDS_PER_DRAW
    assert child.isdisjoint(new_job_id() for _ in range(IDS_PER_DRAW))


def test_a_job_without_options_gets_the_same_record_as_one_with_every_default_spelled_out() -> None:
    payload = {"user": 42, "text": "héllo"}
    short = build_record("email.send", payload, 1 << 20)
    spelled_out = build_record("email.send", payload, 1 << 20, queue="default", job_id=short.id)
    assert short == spelled_out
    for bad in ({"x": float("nan")}, {"x": object()}):
        with pytest.raises(InvalidJob, match="JSON"):
            build_record("email.send", bad, 1 << 20)
    with pytest.raises(InvalidJob, match="job type"):
        build_record("bad type!", payload, 1 << 20)
