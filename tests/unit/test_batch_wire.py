"""The batch wire format: jobs out as JSON, answers back as one Outcome per job, never a success by default."""

from __future__ import annotations

import base64
import json

import pytest

from jobcar.executors.batch_wire import command_input, http_body, outcomes_from_array, outcomes_from_lines
from jobcar.job import Job, State
from jobcar.outcome import Outcome, OutcomeKind


def _job(job_id: str, payload: bytes = b'{"n": 1}', **fields: object) -> Job:
    return Job(id=job_id, queue="q", type="rows", payload=payload, state=State.ACTIVE, attempt=1, **fields)  # type: ignore[arg-type]


JOBS = [_job("a"), _job("b"), _job("c")]


def _outcomes(answers: object) -> list[Outcome]:
    return outcomes_from_array(JOBS, json.dumps(answers).encode(), result_limit=8, max_retry_after=60)


def test_jobs_go_out_with_json_payloads_inline_and_others_in_base64() -> None:
    raw = _job("r", b"\x00\x01", content_type="application/octet-stream", meta={"tenant": "t"}, limit_key="k",
               after=("q/a", "other/b"))  # fmt: skip
    broken = _job("x", b"{not json")
    items = json.loads(http_body([JOBS[0], raw, broken], [5, 5, 5]))
    assert items[0]["payload"] == {"n": 1}
    assert items[0]["attempt"] == 1
    assert items[0]["max_attempts"] == 5
    assert base64.b64decode(items[1]["payload_base64"]) == b"\x00\x01"
    assert (items[1]["meta"], items[1]["key"], items[1]["after"]) == ({"tenant": "t"}, "k", ["q/a", "other/b"])
    assert "after" not in items[0]
    assert base64.b64decode(items[2]["payload_base64"]) == b"{not json"
    lines = command_input([JOBS[0], raw], [5, 5]).splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "r"]


def test_each_job_gets_its_own_answer_and_a_missing_one_is_a_retry() -> None:
    done, retried, missing = _outcomes(
        [
            {"id": "a", "outcome": "done", "result": {"long": "x" * 20}},
            {"id": "b", "outcome": "retry", "error": "later", "retry_after": 600},
            {"id": "zzz", "outcome": "done"},  # not in the batch: ignored
        ]
    )
    assert done == Outcome.success(b'{"long":')  # cut at result_limit
    assert retried == Outcome.retry("later", after=60)  # capped at max_retry_after
    assert missing.kind is OutcomeKind.RETRY
    assert missing.error == "batch answer: the response has no answer for this job"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ({"outcome": "ok"}, 'batch answer: outcome must be one of done, retry, fail, not "ok"'),
        ({"outcome": "fail", "error": 3}, "batch answer: error must be a string, not 3"),
        ({"outcome": "retry", "retry_after": -1}, "batch answer: retry_after must be a number of seconds, not -1"),
        ({"outcome": "retry", "retry_after": True}, "batch answer: retry_after must be a number of seconds, not true"),
        ({}, "batch answer: outcome must be one of done, retry, fail, not null"),
    ],
)
def test_a_malformed_answer_is_that_jobs_retry(answer: dict[str, object], error: str) -> None:
    first, *_ = _outcomes([{"id": "a", **answer}])
    assert first == Outcome.retry(error)


def test_two_answers_for_one_job_are_no_answer_and_a_fail_without_error_says_so() -> None:
    twice, failed, _ = _outcomes(
        [{"id": "a", "outcome": "done"}, {"id": "a", "outcome": "done"}, {"id": "b", "outcome": "fail"}]
    )
    assert twice == Outcome.retry("batch answer: the handler answered more than once for this job")
    assert failed == Outcome.fail("the handler's batch answer says fail")


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"<html>", "batch answer: the response body is not JSON"),
        (b'{"a": 1}', "batch answer: the response body is not a JSON array"),
    ],
)
def test_a_body_that_is_no_array_of_answers_retries_every_job(body: bytes, error: str) -> None:
    outcomes = outcomes_from_array(JOBS, body, result_limit=8, max_retry_after=60)
    assert all(o.kind is OutcomeKind.RETRY and (o.error or "").startswith(error) for o in outcomes)


def test_a_commands_lines_that_are_not_answers_are_skipped() -> None:
    stdout = b'progress 10%\n{"id": "b", "outcome": "done"}\n[1, 2]\n{"id": "a", "outcome": "fail", "error": "e"}\n{"id'
    assert outcomes_from_lines(JOBS, stdout, result_limit=8, max_retry_after=60) == [
        Outcome.fail("e"),
        Outcome.success(),
        None,
    ]


@pytest.mark.parametrize(
    "payload",
    [b"NaN", b'{"x": Infinity}', b'\xef\xbb\xbf{"x": 1}', b'{"x": "\\ud800"}', b'"\xff"'],
    ids=["nan", "infinity", "bom", "lone-surrogate", "not-utf8"],
)
def test_a_payload_a_strict_parser_refuses_goes_as_base64_so_the_batch_stays_valid(payload: bytes) -> None:
    [item] = json.loads(http_body([_job("a", payload)], [1]))
    assert base64.b64decode(item["payload_base64"]) == payload


def test_paired_surrogate_escapes_go_as_the_character_they_stand_for() -> None:
    [item] = json.loads(http_body([_job("a", b'"\\ud83d\\ude00"')], [1]))
    assert item["payload"] == "\U0001f600"
