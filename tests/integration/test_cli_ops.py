"""The operators' commands: `stats`, `jobs list|show`, `dead requeue|purge`, `queue pause|resume`,
`cancel` and `health`, against the session's real Redis (and a real HTTP server for `health`).

Jobs are made with the producer client, and leased or killed with the daemon's own scripts, so every
state is the one a running daemon would leave. Most cases run `main()` in-process; the exit codes a
shell script relies on are also checked on a real `python -m jobcar.cli` process.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from jobcar import Client, Job, handler_calls, transitions, transport
from jobcar.cli import main
from jobcar.cli_health import health_url
from jobcar.config import load_config
from jobcar.config_types import limit_rules
from jobcar.job import State
from jobcar.keys import QueueKeys, job_ref, queues_key
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import ROOT, cli, write_config
from tests.servers import RedisServer, free_port, wait_for

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(config: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """`jobcar -c CONFIG ARGS...` in-process: (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["-c", str(config), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def run_json(run: Run, *args: str) -> object:
    code, out, err = run(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def enqueue(client: Client, count: int = 1, queue: str = "default", **options: object) -> list[str]:
    # Ids of our own: a random one may start with "-", which the command line takes only after "--"
    # (test_an_id_that_starts_with_a_dash).
    return [
        client.enqueue("t.echo", {"n": n}, queue=queue, job_id=f"j{next(_ids)}", **options).id for n in range(count)
    ]


_ids = itertools.count()


def lease(client: Client, count: int, queue: str = "default") -> list[transitions.LeasedJob]:
    """Lease `count` jobs as a daemon would (the oldest pending first): they become active."""
    keys = QueueKeys.of(client.namespace, queue)
    reply = transport.execute(client.redis, [transitions.lease_call(keys, count, 60_000, 3)])[0]
    leased = transitions.parse_lease(keys, reply).jobs
    assert len(leased) == count
    return leased


def talk_back(
    client: Client,
    leased: transitions.LeasedJob,
    *,
    percent: float | None = None,
    message: str | None = None,
    lines: tuple[str, ...] = (),
    max_lines: int = 1000,
    steps: dict[str, bytes] | None = None,
    children: tuple[tuple[str, str], ...] = (),
) -> None:
    """Write what a running job's handler writes through the handler API, with the real scripts (handler_calls),
    fenced by its lease: progress, log lines (the log keeping `max_lines`), steps; and `children` (queue, id),
    recorded with the parent and then enqueued naming it, as the handler API makes them."""
    keys = QueueKeys.of(client.namespace, leased.job.queue)
    job_id, token, attempt = leased.job.id, leased.token, leased.job.attempt
    now = handler_calls.now_ms()
    calls = []
    if percent is not None or message is not None:
        document = handler_calls.progress_document(attempt, percent, message)
        calls.append(handler_calls.progress_call(keys, job_id, token, document))
    if lines:
        entries = [handler_calls.log_entry(attempt, line, now) for line in lines]
        calls.append(handler_calls.log_call(keys, job_id, token, entries, max_lines, 1 << 20))
    for name, value in (steps or {}).items():
        calls.append(handler_calls.step_call(keys, job_id, token, name, handler_calls.step_value(value, now), 100))
    if children:
        refs = [job_ref(queue, child) for queue, child in children]
        calls.append(handler_calls.adopt_call(keys, job_id, token, refs, 1000))
    for reply in transport.execute(client.redis, calls):
        status = handler_calls.parse_log(reply).refusal is None if isinstance(reply, list) else reply == b"ok"
        assert status, reply
    parent = job_ref(leased.job.queue, job_id)
    for queue, child in children:
        client.enqueue("t.echo", {"child": child}, queue=queue, job_id=child)
        client.redis.hset(QueueKeys.of(client.namespace, queue).job(child), "parent", parent)


def make_dead(client: Client, count: int, queue: str = "default", reason: str = "boom") -> list[str]:
    """`count` dead jobs, each killed after one attempt with `reason`. Call before enqueueing others."""
    enqueue(client, count, queue)
    keys = QueueKeys.of(client.namespace, queue)
    leased = lease(client, count, queue)
    calls = [transitions.kill_call(keys, job.job.id, job.token, reason) for job in leased]
    assert transport.execute(client.redis, calls) == [1] * count
    return [job.job.id for job in leased]


def get(client: Client, job_id: str, queue: str | None = None) -> Job:
    job = client.get(job_id, queue=queue)
    assert job is not None, f"job {job_id} not found"
    return job


def table(out: str) -> dict[str, list[str]]:
    """A text table by its first column; the header row is checked and left out."""
    header, *rows = out.splitlines()
    assert header.split()[0] == "QUEUE", out
    return {row.split()[0]: row.split() for row in rows}


def unreachable_config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "away.yaml", f"redis: {{url: 'redis://127.0.0.1:{free_port()}/0'}}\n")


# -- stats -------------------------------------------------------------------------------------------


def test_stats_counts_each_state_of_each_queue(run: Run, client: Client, config: Path) -> None:
    make_dead(client, 1)
    enqueue(client, 1)
    lease(client, 1)  # active
    enqueue(client, 2)
    enqueue(client, 1, delay=3600)
    enqueue(client, 1, queue="extra")  # used by a producer, not in the config
    client.enqueue("t.echo", None, after=["never-enqueued"], on_dependency_failure="run", job_id="w")
    client.enqueue("t.echo", None, after=["w"])  # waiting

    code, out, err = run("stats")
    assert (code, err) == (0, "")
    rows = table(out)
    assert list(rows) == ["default", "low", "extra"]  # the config's queues first, then the others
    # pending scheduled active held waiting dead paused ("w" was pending at once: its dependency is gone)
    assert rows["default"][1:8] == ["3", "1", "1", "0", "1", "1", "no"]
    assert rows["default"][8].endswith("s")
    assert rows["low"][1:9] == ["0", "0", "0", "0", "0", "0", "no", "-"]  # nothing waits: no latency
    assert rows["low"][9:13] == ["0", "0", "0", "0"]  # attempts done and failed in the last minute and hour
    assert rows["low"][13:] == ["-", "0"]  # no max_pending, nothing refused
    assert rows["extra"][1:8] == ["1", "0", "0", "0", "0", "0", "no"]
    # Aligned: the numbers and the latency are right-aligned, so every row is as long as the header.
    assert len({len(line) for line in out.splitlines()}) == 1, out

    stats = run_json(run, "stats")
    assert isinstance(stats, list)
    by_queue = {s["queue"]: s for s in stats}
    assert set(by_queue["default"]) == {
        "queue", "pending", "scheduled", "active", "held", "waiting", "dead", "paused", "latency_seconds",
        "processed_last_minute", "failed_last_minute", "processed_last_hour", "failed_last_hour", "max_pending",
        "refused", "max_pending_by_type",
    }  # fmt: skip
    assert by_queue["default"]["max_pending_by_type"] == {}, "no type is bounded"
    default = by_queue["default"]
    assert (default["pending"], default["scheduled"], default["active"]) == (3, 1, 1)
    assert (default["held"], default["waiting"], default["dead"]) == (0, 1, 1)
    assert default["paused"] is False
    assert 0 <= default["latency_seconds"] < 60
    assert by_queue["low"]["latency_seconds"] == 0
    (extra,) = run_json(run, "stats", "--queue", "extra")
    assert (extra["queue"], extra["pending"]) == ("extra", 1)

    done = cli("stats", "-c", str(config), "--json")
    assert done.returncode == 0, done
    assert {s["queue"]: s["pending"] for s in json.loads(done.stdout)} == {"default": 3, "low": 0, "extra": 1}


def test_stats_with_redis_unreachable_or_a_bad_config(tmp_path: Path) -> None:
    away = unreachable_config(tmp_path)
    done = cli("stats", "-c", str(away))
    assert (done.returncode, done.stdout) == (69, "")
    assert done.stderr.startswith("jobcar: cannot reach Redis at redis://127.0.0.1:")
    bad = write_config(tmp_path / "bad.yaml", "lease: forever\n")
    done = cli("stats", "-c", str(bad))
    assert done.returncode == 78
    assert done.stderr.startswith(f"{bad}:1:8 lease: invalid duration")


def test_every_redis_command_exits_69_when_redis_is_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    away = str(unreachable_config(tmp_path))
    commands = [
        ["stats"],
        ["jobs", "list"],
        ["jobs", "show", "x"],
        ["dead", "requeue", "--all"],
        ["dead", "requeue", "x"],
        ["dead", "purge", "--yes"],
        ["queue", "pause", "default"],
        ["queue", "resume", "default"],
        ["cancel", "x"],
    ]
    for argv in commands:
        assert main([*argv, "-c", away]) == 69, argv
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("jobcar: cannot reach Redis"), (argv, err)
    assert cli("jobs", "list", "-c", away).returncode == 69


# -- jobs list ---------------------------------------------------------------------------------------


def test_jobs_list_every_state_in_run_order(run: Run, client: Client) -> None:
    long_error = "connection refused by the handler at http://127.0.0.1:8080/jobs/email-welcome " * 3
    dead = make_dead(client, 1, reason=long_error)
    active = enqueue(client, 1)
    lease(client, 1)
    pending = enqueue(client, 3)
    later, sooner = enqueue(client, 1, delay=7200) + enqueue(client, 1, delay=3600)
    low = enqueue(client, 1, queue="low")

    jobs = run_json(run, "jobs", "list")
    assert isinstance(jobs, list)
    assert [(j["queue"], j["state"], j["id"]) for j in jobs] == [
        *[("default", "pending", job_id) for job_id in pending],  # the first enqueued runs first
        ("default", "scheduled", sooner),  # by run-at
        ("default", "scheduled", later),
        ("default", "active", active[0]),
        ("default", "dead", dead[0]),
        ("low", "pending", low[0]),
    ]
    by_id = {j["id"]: j for j in jobs}
    assert by_id[dead[0]]["last_error"] == long_error  # whole in JSON
    assert (by_id[dead[0]]["attempt"], by_id[dead[0]]["max_attempts"]) == (1, 3)
    first = by_id[pending[0]]
    assert (first["attempt"], first["max_attempts"], first["type"], first["last_error"]) == (0, None, "t.echo", None)
    assert datetime.fromisoformat(first["created_at"]).tzinfo is not None
    assert 0 <= first["age_seconds"] < 60
    assert datetime.fromisoformat(by_id[sooner]["run_at"]) > datetime.fromisoformat(by_id[sooner]["created_at"])

    code, out, err = run("jobs", "list")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["QUEUE", "STATE", "ID", "TYPE", "ATTEMPT", "AGE", "LAST", "ERROR"]
    assert [row.split()[2] for row in rows] == [j["id"] for j in jobs]
    dead_row = next(row for row in rows if dead[0] in row)
    assert "1/3" in dead_row.split()
    assert dead_row.endswith("…")  # truncated in the table
    assert long_error[:40] in dead_row
    assert len(dead_row) < len(header) + len(long_error)

    # --state, --queue, --limit (per queue and state, with a note of what was left out)
    only_dead = run_json(run, "jobs", "list", "--state", "dead")
    assert [j["id"] for j in only_dead] == dead
    assert [j["id"] for j in run_json(run, "jobs", "list", "--queue", "low")] == low
    code, out, err = run("jobs", "list", "--state", "pending", "--limit", "2")
    assert code == 0
    assert [row.split()[2] for row in out.splitlines()[1:]] == [*pending[:2], low[0]]
    assert err == "jobcar: default pending: 2 of 3 shown (--limit N for more)\n"
    assert run("jobs", "list", "--state", "finished")[0] == 2
    assert run("jobs", "list", "--limit", "0")[0] == 2


def test_jobs_list_with_nothing_and_config_before_the_action(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "-c", str(config), "list"]) == 0
    assert capsys.readouterr().out == "no jobs\n"
    assert main(["jobs", "-c", str(config), "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_jobs_list_shows_what_finished_when_nothing_waits_or_runs(run: Run, client: Client) -> None:
    """After a quickstart's jobs ran, a plain `jobs list` shows them, not "no jobs"."""
    keys = QueueKeys.of(client.namespace, "default")
    enqueue(client, 2)
    for job in lease(client, 2):
        transport.execute(client.redis, [transitions.ack_call(keys, job.job.id, job.token, retention_ms=600_000)])
    done = run_json(run, "jobs", "list")
    assert sorted(j["state"] for j in done) == ["done", "done"]
    pending = enqueue(client, 1)
    assert [j["id"] for j in run_json(run, "jobs", "list")] == pending, "done jobs only when nothing else"


# -- jobs show ---------------------------------------------------------------------------------------


def test_jobs_show_every_field(run: Run, client: Client) -> None:
    (dead,) = make_dead(client, 1, reason="exit status 1: bad input")
    info = client.enqueue(
        "t.echo", {"user": 42}, job_id="order-17", max_attempts=5, timeout=30, meta={"origin": "test"}, delay=3600
    )

    shown = run_json(run, "jobs", "show", "order-17")
    assert isinstance(shown, dict)
    assert shown["id"] == "order-17"
    assert shown["queue"] == info.queue == "default"
    assert (shown["type"], shown["state"], shown["attempt"], shown["max_attempts"]) == ("t.echo", "scheduled", 0, 5)
    assert shown["payload"] == {"user": 42}
    assert (shown["timeout_seconds"], shown["meta"], shown["content_type"]) == (
        30,
        {"origin": "test"},
        "application/json",
    )
    assert shown["errors"] == []
    assert shown["result"] is None
    assert shown["cancel_requested"] is False
    assert datetime.fromisoformat(shown["run_at"]) > datetime.fromisoformat(shown["created_at"])

    code, out, err = run("jobs", "show", "order-17")
    assert (code, err) == (0, "")
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert fields["state"] == "scheduled"
    assert fields["attempt"] == "0 of 5"
    assert fields["payload"] == '{"user":42}'
    assert fields["meta"] == '{"origin": "test"}'
    assert "(in 59m" in fields["run at"]

    # the error history of a dead job
    shown = run_json(run, "jobs", "show", dead)
    assert isinstance(shown, dict)
    assert shown["state"] == "dead"
    assert [(e["attempt"], e["error"]) for e in shown["errors"]] == [(1, "exit status 1: bad input")]
    assert shown["finished_at"] is not None
    code, out, _ = run("jobs", "show", dead)
    assert "errors (1, oldest first):" in out
    assert "attempt 1 at " in out
    assert out.rstrip().endswith("exit status 1: bad input")


def test_jobs_show_what_a_job_waits_for_and_what_waits_for_it(run: Run, client: Client) -> None:
    client.enqueue("t.echo", None, job_id="first")
    client.enqueue("t.echo", None, job_id="other", queue="low")
    assert run("enqueue", "t.echo", "--id", "next", "--after", "first", "--after", "low/other")[0] == 0
    assert run("enqueue", "t.echo", "--id", "last", "--after", "next", "--on-dependency-failure", "cancel")[0] == 0

    code, out, err = run("jobs", "show", "next")
    assert (code, err) == (0, "")
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert fields["state"] == "waiting"
    assert fields["after"] == "default/first low/other (if one fails: fail)"
    assert fields["waiting for"] == "default/first low/other"
    assert fields["waited for by"] == "default/last"
    shown = run_json(run, "jobs", "show", "last")
    assert isinstance(shown, dict)
    assert (shown["after"], shown["on_dependency_failure"], shown["dependents"]) == (["default/next"], "cancel", [])
    listed = run_json(run, "jobs", "list", "--state", "waiting")
    assert isinstance(listed, list)
    assert sorted(job["id"] for job in listed) == ["last", "next"]


def test_jobs_show_of_a_job_key_holding_another_type_says_so(run: Run, client: Client) -> None:
    client.redis.set(QueueKeys.of(client.namespace, "default").job("odd"), "not a hash")
    code, out, err = run("jobs", "show", "odd", "--queue", "default")
    assert (code, out) == (1, "")
    assert err.startswith("jobcar: Redis refused the command: WRONGTYPE"), err  # then the server's own words


def test_jobs_show_an_active_job_and_a_binary_payload(run: Run, client: Client) -> None:
    raw = bytes(range(256))
    client.enqueue("t.echo", raw, job_id="blob")
    (leased,) = lease(client, 1)
    shown = run_json(run, "jobs", "show", "blob")
    assert isinstance(shown, dict)
    assert "payload" not in shown
    assert base64.b64decode(shown["payload_base64"]) == raw
    assert (shown["state"], shown["attempt"]) == ("active", 1)
    assert "lease_token" not in shown  # the attempt's fence stays inside
    assert leased.token not in json.dumps(shown)
    assert datetime.fromisoformat(shown["lease_expires_at"]) > datetime.fromisoformat(shown["started_at"])
    assert shown["content_type"] == "application/octet-stream"
    code, out, _ = run("jobs", "show", "blob")
    assert code == 0
    assert "<256 bytes, not UTF-8 text; --json gives them in base64>" in out
    assert "lease expires" in out
    assert leased.token not in out


def test_jobs_show_a_missing_or_ambiguous_id(run: Run, client: Client, config: Path) -> None:
    code, out, err = run("jobs", "show", "nope")
    assert (code, out, err) == (1, "", "jobcar: no such job nope\n")
    done = cli("jobs", "show", "nope", "-c", str(config))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "jobcar: no such job nope\n")

    client.enqueue("t.echo", 1, job_id="twice")
    client.enqueue("t.echo", 2, job_id="twice", queue="low")
    code, _, err = run("jobs", "show", "twice")
    assert code == 2
    assert "in several queues: default (pending), low (pending); choose one with --queue" in err
    shown = run_json(run, "jobs", "show", "twice", "--queue", "low")
    assert isinstance(shown, dict)
    assert shown["payload"] == 2
    assert run("jobs", "show", "twice", "--queue", "nope")[0] == 1


# -- what a job's handler wrote (the handler API) -------------------------------------------------------


def test_jobs_show_progress_log_steps_children_and_parent(run: Run, client: Client) -> None:
    client.enqueue("t.echo", {"n": 1}, job_id="parent")
    (leased,) = lease(client, 1)
    talk_back(
        client, leased, percent=42.5, message="copying \x1b[31mred", lines=("one", "two", "three"), max_lines=2,
        steps={"fetch": b"x" * 2048, "parse": b""}, children=(("default", "kid1"), ("low", "kid2")),
    )  # fmt: skip
    lease(client, 1)  # kid1 runs

    code, out, err = run("jobs", "show", "parent")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    progress = next(line for line in lines if line.startswith("progress"))
    assert "42.5%: copying \\x1b[31mred (attempt 1, " in progress  # the handler's text, made printable
    assert "\x1b" not in out
    assert re.search(r"^log +2 lines kept, 1 older line dropped \(jobcar jobs logs parent\)$", out, re.MULTILINE)
    assert "steps (2):\n  NAME " in out
    assert re.search(r"^  fetch +2\.0 KiB +\d{4}-\d\d-\d\dT[\d:.]+Z \(.+ ago\)$", out, re.MULTILINE)
    assert re.search(r"^  parse +0 B +\d{4}-", out, re.MULTILINE)
    assert "children (2, oldest first; jobs list --parent for more):" in out
    assert re.search(r"^  default/kid1 +active$", out, re.MULTILINE)
    assert re.search(r"^  low/kid2 +pending$", out, re.MULTILINE)
    assert leased.token not in out

    shown = run_json(run, "jobs", "show", "parent")
    assert isinstance(shown, dict)
    assert shown["progress"]["percent"] == 42.5
    assert shown["progress"]["message"] == "copying \x1b[31mred"
    assert shown["progress"]["attempt"] == 1
    assert datetime.fromisoformat(shown["progress"]["at"])
    assert shown["log"] == {"lines": 2, "dropped": 1}
    assert [(s["name"], s["bytes"]) for s in shown["steps"]] == [("fetch", 2048), ("parse", 0)]
    assert all(datetime.fromisoformat(s["at"]) for s in shown["steps"])
    assert "x" * 100 not in json.dumps(shown), "a step's result is never in the document"
    assert [(c["ref"], c["state"]) for c in shown["children"]] == [("default/kid1", "active"), ("low/kid2", "pending")]
    assert shown["children_total"] == 2
    assert shown["parent"] is None
    assert "lease_token" not in shown

    child = run_json(run, "jobs", "show", "kid2")
    assert isinstance(child, dict)
    assert (child["parent"], child["progress"], child["log"], child["steps"], child["children"]) == (
        "default/parent",
        None,
        {"lines": 0, "dropped": 0},
        [],
        [],
    )
    code, out, _ = run("jobs", "show", "kid2")
    assert re.search(r"^parent +default/parent$", out, re.MULTILINE)
    assert "progress" not in out
    job = client.get("parent")
    assert job is not None
    assert job.progress is not None
    assert (job.progress.percent, job.progress.message, job.progress.attempt) == (42.5, "copying \x1b[31mred", 1)
    assert get(client, "kid1").parent == "default/parent"


def test_jobs_show_counts_every_child_and_lists_the_first_hundred(run: Run, client: Client) -> None:
    client.enqueue("t.echo", {}, job_id="many")
    (leased,) = lease(client, 1)
    talk_back(client, leased, children=tuple(("low", f"c{n:03d}") for n in range(105)))
    shown = run_json(run, "jobs", "show", "many")
    assert isinstance(shown, dict)
    assert shown["children_total"] == 105
    assert len(shown["children"]) == 100
    assert shown["children"][0]["ref"] == "low/c000"
    _, out, _ = run("jobs", "show", "many")
    assert "children (105, the first 100 shown, oldest first; jobs list --parent for more):" in out


@pytest.mark.parametrize("written", [b"not json", b"[1]", b'{"percent": 5}', b'{"at": "x", "attempt": 1}'])
def test_a_progress_field_written_by_hand_reads_as_none(run: Run, client: Client, written: bytes) -> None:
    client.enqueue("t.echo", {}, job_id="odd")
    client.redis.hset(QueueKeys.of(client.namespace, "default").job("odd"), "progress", written)
    assert get(client, "odd").progress is None
    shown = run_json(run, "jobs", "show", "odd")
    assert isinstance(shown, dict)
    assert shown["progress"] is None


def test_jobs_logs_prints_each_line_and_says_what_was_dropped(run: Run, client: Client, config: Path) -> None:
    client.enqueue("t.echo", {}, job_id="talker")
    (leased,) = lease(client, 1)
    talk_back(client, leased, lines=("first", "second <b>", "third\nwith a newline \x07"), max_lines=2)
    code, out, err = run("jobs", "logs", "talker")
    assert code == 0
    assert err == "jobcar: 1 line dropped before these (the job's log keeps its newest lines)\n"
    first, second = out.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z  #1  second <b>", first)
    assert second.endswith("  #1  third\\nwith a newline \\x07")
    code, out, _ = run("jobs", "logs", "talker", "--json", "--queue", "default")
    assert code == 0
    entries = [json.loads(line) for line in out.splitlines()]
    assert [(e["attempt"], e["line"]) for e in entries] == [(1, "second <b>"), (1, "third\nwith a newline \x07")]
    assert all(datetime.fromisoformat(e["at"]) for e in entries)

    client.enqueue("t.echo", {}, job_id="quiet")
    assert run("jobs", "logs", "quiet") == (0, "", "")
    done = cli("jobs", "logs", "nope", "-c", str(config))
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "jobcar: no such job nope\n")


def test_jobs_logs_follow_prints_new_lines_until_the_job_ends(client: Client, config: Path) -> None:
    client.enqueue("t.echo", {}, job_id="long")
    (leased,) = lease(client, 1)
    talk_back(client, leased, lines=("a",))
    command = [sys.executable, "-m", "jobcar.cli", "-c", str(config), "jobs", "logs", "long", "--follow"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
    printed: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ) as follower:
        assert follower.stdout is not None
        assert follower.stderr is not None
        reader = threading.Thread(target=lambda: printed.extend(iter(follower.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        try:
            wait_for(lambda: len(printed) == 1, what="the line written before")
            talk_back(client, leased, lines=("b",))
            wait_for(lambda: len(printed) == 2, what="a line written while it follows")
            # Five lines while the log keeps two: three are dropped before the follower reads them.
            talk_back(client, leased, lines=("c", "d", "e", "f", "g"), max_lines=2)
            wait_for(lambda: len(printed) == 4, what="the lines kept")
            assert follower.poll() is None, "it follows while the job is active"
            keys = QueueKeys.of(client.namespace, "default")
            transport.execute(client.redis, [transitions.ack_call(keys, "long", leased.token, retention_ms=60_000)])
            assert follower.wait(timeout=30) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
        reader.join(timeout=10)
        dropped = follower.stderr.read()
    assert [line.split("  ")[-1].strip() for line in printed] == ["a", "b", "f", "g"]
    assert dropped == "jobcar: 3 lines dropped before these (the job's log keeps its newest lines)\n"


def test_jobs_list_parent_lists_the_children_from_the_parents_set(run: Run, client: Client) -> None:
    client.enqueue("t.echo", {}, job_id="p")
    client.enqueue("t.echo", {}, job_id="stranger")  # no child: never listed
    (leased,) = lease(client, 1)
    talk_back(client, leased, children=(("low", "k1"), ("default", "k2"), ("low", "k3")))
    client.redis.delete(QueueKeys.of(client.namespace, "low").job("k3"))  # gone: not listed
    listed = run_json(run, "jobs", "list", "--parent", "default/p")
    # Oldest first; made in the same ms, by reference.
    assert [(j["queue"], j["id"]) for j in listed] == [("default", "k2"), ("low", "k1")]  # type: ignore[union-attr]
    listed = run_json(run, "jobs", "list", "--parent", "p", "--queue", "low")
    assert [j["id"] for j in listed] == ["k1"]  # type: ignore[union-attr]
    assert run_json(run, "jobs", "list", "--parent", "p", "--state", "active") == []
    code, out, err = run("jobs", "list", "--parent", "p", "--limit", "1")
    assert code == 0
    assert table(out)["default"][2] == "k2"
    assert "stranger" not in out
    assert err == "jobcar: the first 1 of 3 children shown (--limit N for more)\n"
    assert run("jobs", "list", "--parent", "default/nope")[:2] == (1, "")


# -- dead requeue / purge ----------------------------------------------------------------------------


def test_dead_requeue_one_then_all(run: Run, client: Client, config: Path) -> None:
    first, second, third = make_dead(client, 3)
    (low,) = make_dead(client, 1, queue="low")

    code, out, err = run("dead", "requeue", second)  # no --queue: found where it is
    assert (code, out, err) == (0, "requeued 1 job (default: 1)\n", "")
    job = get(client, second)
    assert (job.state, job.attempt) == (State.PENDING, 0)
    assert job.errors, "the history stays"

    # ids that are not dead are named, and the exit code says so; the dead ones still move
    code, out, err = run("dead", "requeue", second, "nope", third)
    assert (code, out) == (1, "requeued 1 job (default: 1)\n")
    assert err == f"jobcar: job {second} is not dead (pending in default)\njobcar: no such job nope\n"

    done = cli("dead", "requeue", "--all", "--queue", "default", "-c", str(config))
    assert (done.returncode, done.stdout) == (0, "requeued 1 job (default: 1)\n"), done
    assert get(client, first).state is State.PENDING
    assert get(client, low).state is State.DEAD
    assert run("dead", "requeue", "--all") == (0, "requeued 1 job (low: 1)\n", "")
    assert run("dead", "requeue", "--all") == (0, "requeued 0 jobs\n", "")
    stats = run_json(run, "stats")
    assert isinstance(stats, list)
    assert [(s["queue"], s["pending"], s["dead"]) for s in stats] == [("default", 3, 0), ("low", 1, 0)]

    # usage: ids or --all, one of them
    assert run("dead", "requeue")[0] == 2
    assert run("dead", "requeue", "--all", first)[0] == 2
    assert cli("dead", "requeue", "-c", str(config)).returncode == 2


def test_dead_requeue_all_moves_more_than_one_call_takes(
    run: Run, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dead(client, 5)
    monkeypatch.setattr("jobcar.admin.BULK_LIMIT", 2)  # 3 calls: 2 + 2 + 1
    assert run("dead", "requeue", "--all")[:2] == (0, "requeued 5 jobs (default: 5)\n")
    assert client.redis.llen(QueueKeys.of(client.namespace, "default").pending) == 5


def test_dead_purge_needs_yes(run: Run, client: Client, config: Path) -> None:
    default = make_dead(client, 3)
    (low,) = make_dead(client, 1, queue="low")
    enqueue(client, 1)  # pending: never purged

    code, out, err = run("dead", "purge")
    assert (code, out) == (2, "")
    assert err == "jobcar: dead purge deletes the dead jobs of every queue for good; add --yes to do it\n"
    done = cli("dead", "purge", "--queue", "low", "-c", str(config))
    assert done.returncode == 2
    assert "add --yes" in done.stderr
    assert get(client, low).state is State.DEAD  # nothing was deleted

    assert run("dead", "purge", "--queue", "low", "--yes") == (0, "deleted 1 dead job (low: 1)\n", "")
    assert client.get(low) is None
    assert get(client, default[0]).state is State.DEAD
    done = cli("dead", "purge", "--yes", "-c", str(config))
    assert (done.returncode, done.stdout) == (0, "deleted 3 dead jobs (default: 3)\n"), done
    assert all(client.get(job_id) is None for job_id in default)
    stats = run_json(run, "stats")
    assert [(s["pending"], s["dead"]) for s in stats] == [(1, 0), (0, 0)]


# -- queue pause / resume ----------------------------------------------------------------------------


def test_pause_and_resume_show_in_stats(run: Run, client: Client, config: Path) -> None:
    def paused() -> dict[str, bool]:
        stats = run_json(run, "stats")
        assert isinstance(stats, list)
        return {s["queue"]: s["paused"] for s in stats}

    assert run("queue", "pause", "low") == (0, "queue low paused: its jobs wait until `jobcar queue resume low`\n", "")
    assert paused() == {"default": False, "low": True}
    assert table(run("stats")[1])["low"][7] == "yes"
    assert run("queue", "pause", "low") == (0, "queue low was already paused\n", "")
    # A paused queue leases nothing (what the daemon sees).
    enqueue(client, 1, queue="low")
    keys = QueueKeys.of(client.namespace, "low")
    reply = transport.execute(client.redis, [transitions.lease_call(keys, 1, 60_000, 3)])[0]
    assert transitions.parse_lease(keys, reply).paused

    done = cli("queue", "resume", "low", "-c", str(config))
    assert (done.returncode, done.stdout) == (0, "queue low resumed\n"), done
    assert paused() == {"default": False, "low": False}
    assert run("queue", "resume", "low") == (0, "queue low was not paused\n", "")

    code, _, err = run("queue", "pause", "nowhere")
    assert code == 0
    assert "no producer has used queue 'nowhere'" in err
    assert run("queue", "resume", "nowhere")[0] == 0
    assert run("queue", "pause", "bad name")[0] == 2
    assert run("queue", "pause")[0] == 2


# -- cancel ------------------------------------------------------------------------------------------


def test_cancel_in_each_state(run: Run, client: Client, config: Path) -> None:
    (dead,) = make_dead(client, 1)
    (active,) = enqueue(client, 1)
    lease(client, 1)
    (pending,) = enqueue(client, 1)
    (scheduled,) = enqueue(client, 1, delay=3600)

    code, out, err = run("cancel", pending)
    assert (code, err) == (0, "")
    assert out == f"canceled job {pending} (pending in queue default): it is deleted and will not run\n"
    assert client.get(pending) is None
    assert run("cancel", scheduled, "--queue", "default")[0] == 0
    assert client.get(scheduled) is None

    code, out, err = run("cancel", active)
    assert (code, err) == (0, "")
    assert out.startswith(f"cancel requested for job {active}: it is running")
    job = get(client, active)
    assert (job.state, job.cancel_requested) == (State.ACTIVE, True)
    assert client.redis.hget(QueueKeys.of(client.namespace, "default").job(active), "cancel") == b"1"

    code, out, err = run("cancel", dead)
    assert (code, out) == (1, "")
    assert err == f"jobcar: job {dead} in queue default is already dead: nothing to cancel\n"
    done = cli("cancel", "nope", "-c", str(config))
    assert (done.returncode, done.stderr) == (1, "jobcar: no such job nope\n")
    done = cli("cancel", active, "-c", str(config))
    assert done.returncode == 0, done
    assert run("cancel")[0] == 2


def test_an_id_that_starts_with_a_dash(run: Run, client: Client, config: Path) -> None:
    # Random ids are URL-safe base64: one in 64 starts with "-". After "--" it is an id, not an option.
    client.enqueue("t.echo", 1, job_id="-d")
    (leased,) = lease(client, 1)
    keys = QueueKeys.of(client.namespace, "default")
    assert transport.execute(client.redis, [transitions.kill_call(keys, "-d", leased.token, "boom")]) == [1]
    client.enqueue("t.echo", 2, job_id="-q1")

    code, out, _ = run("jobs", "show", "--json", "--", "-q1")
    shown = json.loads(out)
    assert isinstance(shown, dict)
    assert (shown["id"], shown["payload"]) == ("-q1", 2)
    code, out, _ = run("cancel", "--queue", "default", "--", "-q1")
    assert (code, out) == (0, "canceled job -q1 (pending in queue default): it is deleted and will not run\n")
    done = cli("-c", str(config), "dead", "requeue", "--", "-d", "-q1")
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "requeued 1 job (default: 1)\n",
        "jobcar: no such job -q1\n",
    )
    assert get(client, "-d").state is State.PENDING


# -- enqueue builds its record once ------------------------------------------------------------------


def test_enqueue_registers_the_queue_and_stores_the_job(run: Run, client: Client) -> None:
    code, out, _ = run("enqueue", "t.echo", '{"a": 1}', "--queue", "low", "--id", "e-1", "--json")
    assert code == 0
    assert json.loads(out) == {"id": "e-1", "queue": "low", "state": "pending", "status": "created"}
    assert get(client, "e-1").payload == b'{"a": 1}'
    assert client.redis.sismember(queues_key(client.namespace), "low")


# -- health ------------------------------------------------------------------------------------------


class _Health:
    """A tiny /healthz server: answers `status` with `body`."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        owner = self
        self.status = 200
        self.body = b"ok\n"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = (owner.status, owner.body) if self.path == "/healthz" else (404, b"not found")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        self.server = Server((host, 0), Handler)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def health_server() -> Iterator[_Health]:
    server = _Health()
    yield server
    server.close()


def listen_config(tmp_path: Path, listen: str) -> str:
    # A token: jobcar (check and run alike) refuses a listener on every address without one.
    return str(write_config(tmp_path / "listen.yaml", f"listen: '{listen}'\napi_token: t0ken\n"))


def test_health_url_from_listen() -> None:
    assert health_url("127.0.0.1:9321") == "http://127.0.0.1:9321/healthz"
    assert health_url("[::1]:9321") == "http://[::1]:9321/healthz"
    assert health_url("0.0.0.0:9321") == "http://127.0.0.1:9321/healthz"
    assert health_url("[::]:9321") == "http://[::1]:9321/healthz"
    assert health_url("jobcar.internal:80") == "http://jobcar.internal:80/healthz"


def test_health_ok_and_failing(tmp_path: Path, health_server: _Health, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{health_server.port}/healthz"
    # From the config's listen, and with --url and no config file at all.
    assert main(["health", "-c", listen_config(tmp_path, f"127.0.0.1:{health_server.port}")]) == 0
    assert capsys.readouterr().out == f"ok: {url} answered 200\n"
    assert main(["health", "-c", listen_config(tmp_path, f"0.0.0.0:{health_server.port}")]) == 0
    capsys.readouterr()
    done = cli("health", "--url", url, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"ok: {url} answered 200\n"), done

    health_server.status, health_server.body = 503, b"redis unreachable\nmore detail\n"
    done = cli("health", "--url", url)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"jobcar: {url} answered HTTP 503: redis unreachable\n"
    health_server.status = 204  # only 200 is healthy
    assert main(["health", "--url", url]) == 1
    assert capsys.readouterr().err == f"jobcar: {url} answered HTTP 204\n"
    assert main(["health", "--url", f"http://127.0.0.1:{health_server.port}/elsewhere"]) == 1
    assert "answered HTTP 404: not found" in capsys.readouterr().err


def test_health_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}/healthz"
    done = cli("health", "--url", closed)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", f"jobcar: {closed}: connection refused\n")

    # Accepts the connection (the kernel's backlog) and never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/healthz"
        assert main(["health", "--url", url, "--timeout", "200ms"]) == 1
        assert capsys.readouterr().err == f"jobcar: {url}: no answer within 0.2s\n"

    # No --url and no config: the config is needed for its listen address.
    done = cli("health", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (78, "jobcar.yaml: no such file\n")
    assert main(["health", "--url", "ftp://example.com/"]) == 2
    assert main(["health", "--url", closed, "--timeout", "0s"]) == 2
    assert main(["health", "--url", closed, "--timeout", "soon"]) == 2
    capsys.readouterr()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_health_on_an_ipv6_listen_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = _Health(socket.AF_INET6)
    try:
        assert main(["health", "-c", listen_config(tmp_path, f"[::1]:{server.port}")]) == 0
        assert capsys.readouterr().out == f"ok: http://[::1]:{server.port}/healthz answered 200\n"
        assert main(["health", "-c", listen_config(tmp_path, f"[::]:{server.port}")]) == 0
        capsys.readouterr()
    finally:
        server.close()


def test_limits_shows_each_group_running_held_and_a_rates_next_start(
    tmp_path: Path, redis_server: RedisServer, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "limits.yaml",
        f"""\
        redis: {{url: "{redis_server.url}"}}
        namespace: {namespace}
        handlers:
          a: {{command: [cat], limits: {{concurrency: 1, rate: 1/m}}}}
        """,
    )
    assert main(["-c", str(config), "limits"]) == 0
    assert capsys.readouterr().out == "no limit group has a job running, held or rated\n"
    with redis_server.client() as r:
        q = QueueDriver(r, namespace)
        for n in range(3):
            q.enqueue("a", n)
        assert len(q.lease(limits=limit_rules(load_config(str(config)))).jobs) == 1
    assert main(["-c", str(config), "limits"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["default"][1:6] == ["a", "concurrency", "1", "2", "1"]
    assert main(["-c", str(config), "limits", "--json"]) == 0
    rate = [g for g in json.loads(capsys.readouterr().out) if g["kind"] == "rate"]
    assert [(g["group"], g["limit"], g["running"], g["held"]) for g in rate] == [("@a", "1/60000ms", 0, 0)]
    assert 55_000 < rate[0]["next_start_in_ms"] <= 60_000
