"""The enqueue options are defined once (jobcar/options.py): every place that lists them is held against it."""

from __future__ import annotations

import inspect
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from jobcar.enqueue_request import JOB_FIELDS, job_spec
from jobcar.errors import InvalidJob
from jobcar.options import OPTIONS, SCHEDULE_OPTIONS, Kind, api_name
from jobcar.records import build_record, checked
from jobcar.schedules import SCHEDULE_FIELDS, SPEC_FIELDS, make_spec

ROOT = Path(__file__).resolve().parents[2]
STORE_JOBS = ROOT / "daemon" / "jobcar" / "lua" / "includes" / "store_jobs.lua"
#: Fields of a record that no option sets: the client's dependency protocol writes them (ADR 0016).
INTERNAL_FIELDS = {"dependents", "parent"}

#: A value of each option that passes its checks alone or with the others below.
EVERY_OPTION: dict[str, Any] = {
    "queue": "q", "delay": None, "run_at": None, "max_attempts": 3, "unique_for": "1m", "unique_key": "u",
    "unique_mode": "window", "job_id": "j", "timeout": "10s", "backoff": "2s", "content_type": "text/plain",
    "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "meta": {"m": "v"}, "batch": "b", "priority": 4,
    "expires_in": "1h", "expires_at": None, "debounce": None, "debounce_key": None, "debounce_max_wait": None,
    "key": "tenant", "after": ["other"], "on_dependency_failure": "run", "keep_for": "2h",
}  # fmt: skip


def lua_fields() -> set[str]:
    table = re.search(r"local function optional_fields\(\)\s*return \{(.*?)\}", STORE_JOBS.read_text(), re.S)
    assert table is not None, "store_jobs.lua's optional_fields() table moved"
    return set(re.findall(r"(\w+) = '", table.group(1)))


def test_the_enqueue_scripts_field_table_has_a_field_for_every_option_that_travels_as_one() -> None:
    carried = {option.field for option in OPTIONS.values() if option.field}
    assert carried | INTERNAL_FIELDS == lua_fields()


def test_a_record_with_every_option_sends_only_fields_the_script_knows() -> None:
    assert set(EVERY_OPTION) == set(OPTIONS), "give every option a value above"
    given = {name: value for name, value in EVERY_OPTION.items() if value is not None}
    record = build_record("t", b"body", 1024, **given)
    sent = set(record.optional_fields()[::2])
    assert sent <= lua_fields()
    assert "backoff" in sent
    assert record.backoff_ms == 2000


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.kind is Kind.DURATION])
def test_every_duration_option_takes_seconds_a_timedelta_or_text_and_refuses_anything_else(name: str) -> None:
    assert checked({name: "1m30s"})[name] == 90_000
    assert checked({name: 1.5})[name] == 1500
    with pytest.raises(InvalidJob, match=name):
        checked({name: [1]})
    with pytest.raises(InvalidJob, match=name):
        checked({name: "soon"})
    if OPTIONS[name].minimum:
        with pytest.raises(InvalidJob, match=f"{name} must be positive"):
            checked({name: 0})


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.kind is Kind.INSTANT])
def test_every_instant_option_takes_an_aware_datetime_or_epoch_seconds(name: str) -> None:
    assert checked({name: datetime(2030, 1, 2, tzinfo=UTC)})[name] == 1_893_542_400_000
    assert checked({name: 1_893_542_400})[name] == 1_893_542_400_000
    with pytest.raises(InvalidJob, match="timezone-aware"):
        checked({name: datetime(2030, 1, 2)})


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.kind is Kind.COUNT])
def test_every_count_option_refuses_a_bool_a_float_and_a_number_out_of_its_range(name: str) -> None:
    option = OPTIONS[name]
    assert checked({name: option.minimum})[name] == option.minimum
    for wrong in (True, 1.5, option.minimum - 1, *(() if option.maximum is None else (option.maximum + 1,))):
        with pytest.raises(InvalidJob, match=f"{name} must be"):
            checked({name: wrong})


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.kind is Kind.CHOICE])
def test_every_choice_option_takes_only_its_choices(name: str) -> None:
    for choice in OPTIONS[name].choices:
        assert checked({name: choice})[name] == choice
    with pytest.raises(InvalidJob, match=f"{name} must be one of"):
        checked({name: "something-else"})


def test_the_http_api_takes_every_option_under_its_api_name() -> None:
    """Each option sent under its API name reaches the client as that option, durations and instants read."""
    given = {name: value for name, value in EVERY_OPTION.items() if value is not None and name != "content_type"}
    body = {"type": "t", **{api_name(name): value for name, value in given.items()}}
    _, _, options = job_spec(body)
    assert options.keys() == given.keys()
    assert (options["timeout"], options["backoff"]) == (10.0, 2.0)
    assert {api_name(name) for name in OPTIONS} | {"type", "payload", "payload_base64"} == JOB_FIELDS


def test_make_specs_own_keywords_are_the_schedules_own_fields() -> None:
    parameters = inspect.signature(make_spec).parameters
    own = [p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
    assert own[:-1] == list(SCHEDULE_FIELDS)
    assert own[-1] == "max_payload_bytes"  # how big a payload may be, not a field of the schedule


def test_a_schedule_takes_every_schedule_option_and_no_other() -> None:
    make_spec("s", type="t", every="1m", **{name: EVERY_OPTION[name] for name in SCHEDULE_OPTIONS})
    for name in OPTIONS.keys() - set(SCHEDULE_OPTIONS) - set(SCHEDULE_FIELDS):  # a schedule has a queue of its own
        with pytest.raises(InvalidJob, match=f"unknown schedule option\\(s\\): {name}"):
            make_spec("s", type="t", every="1m", **{name: EVERY_OPTION[name] or "1s"})


#: The shape config/schema.json gives a schedule's job option of each kind.
SCHEMA_SHAPES = {
    Kind.DURATION: lambda _: {"$ref": "#/$defs/duration"},
    Kind.COUNT: lambda option: (
        {"$ref": "#/$defs/positiveInteger"}
        if option.minimum == 1 and option.maximum is None
        else {"type": "integer", "minimum": option.minimum, "maximum": option.maximum}
    ),
    Kind.STRINGS: lambda _: {"type": "object", "additionalProperties": {"type": "string"}},
}


def test_the_schema_describes_each_schedule_field_and_each_job_option_by_its_kind() -> None:
    schema = json.loads((ROOT / "config" / "schema.json").read_text())
    properties = schema["$defs"]["schedule"]["properties"]
    assert list(properties) == list(SCHEDULE_FIELDS) + sorted(SCHEDULE_OPTIONS, key=list(properties).index)
    for name in SCHEDULE_OPTIONS:
        option = OPTIONS[name]
        shape = {k: v for k, v in properties[name].items() if k != "description"}
        assert shape == SCHEMA_SHAPES[option.kind](option), name


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table under `header`."""
    lines = text[text.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return rows


def test_the_readmes_options_table_names_every_option_once_and_marks_the_schedule_options() -> None:
    rows = table_rows((ROOT / "README.md").read_text(), "| option | schedules | what it does |")
    named = [name for option, _, _ in rows for name in re.findall(r"`(\w+)`", option)]
    assert sorted(named) == sorted(OPTIONS)
    # A mark names the options it marks where its row names several but not all of them take one.
    marked = {
        name
        for option, mark, _ in rows
        if "✓" in mark
        for name in re.findall(r"`(\w+)`", mark) or re.findall(r"`(\w+)`", option)
    }
    assert marked == set(SCHEDULE_OPTIONS)


def test_the_readmes_post_jobs_row_lists_every_field() -> None:
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `POST /v1/jobs` |"))
    fields = re.search(r"enqueue `\{(.*?)\}`", row)
    assert fields is not None
    names = re.sub(r': "[^"]*"', "", fields.group(1))  # an example value: "delay": "10s"
    assert set(re.findall(r'"(\w+)"', names)) == JOB_FIELDS


def test_the_configuration_docs_have_a_row_for_every_schedule_field() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `schedules\.<name>\.(\w+)` \|", text, re.M))
    assert rows == set(SPEC_FIELDS)


def test_mypy_refuses_an_unknown_option_and_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    """Client.enqueue's keywords are typed: a producer's checker catches a typo before it runs."""
    from mypy import api as mypy

    snippet = tmp_path / "producer.py"
    snippet.write_text(
        "from jobcar import AsyncClient, Client\n\n\n"
        "async def produce(client: Client, aclient: AsyncClient) -> None:\n"
        '    client.enqueue("t", None, priority=3, delay="10s", after=["x"], backoff=2.5, meta={"a": "b"})\n'
        '    client.enqueue("t", None, priorty=3)\n'
        '    await aclient.enqueue("t", None, max_attempts="3")\n'
    )
    out, _, status = mypy.run(["--strict", "--cache-dir", str(tmp_path / "cache"), str(snippet)])
    assert status == 1, out
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert len(errors) == 2, out
    assert 'Unexpected keyword argument "priorty"' in errors[0]
    assert 'Argument "max_attempts" to "enqueue" of "AsyncClient" has incompatible type "str"' in errors[1]


@pytest.mark.parametrize(
    ("command", "names"),
    [(["enqueue"], list(OPTIONS)), (["schedules", "set"], list(SCHEDULE_OPTIONS))],
    ids=["enqueue", "schedules set"],
)
def test_the_cli_offers_a_flag_for_every_option_that_has_one(
    command: list[str], names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from jobcar.cli import main
    from jobcar.options import flag

    assert {name for name in OPTIONS if flag(name) is None} == {"traceparent", "meta", "batch"}
    assert main([*command, "--help"]) == 0
    shown = capsys.readouterr().out
    for name in names:
        if flag(name) is not None:
            assert re.search(rf"\s{re.escape(flag(name) or '')}[\s,]", shown), f"{name}: {shown}"


def test_the_cli_reads_each_flag_by_its_options_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from jobcar.cli import main

    for bad, says in (("--backoff=soon", "--backoff"), ("--priority=12", "from 0 (first) to 9"),
                      ("--max-attempts=0", "positive integer"), ("--at=tomorrow", "invalid time")):  # fmt: skip
        assert main(["enqueue", "-c", "/nonexistent.yaml", "t", bad]) == 2
        assert says in capsys.readouterr().err, bad
