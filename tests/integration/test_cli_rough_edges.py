"""What a new user reached for and found missing or rough: `--version`, `--json` on every command, one
dead job deleted by id, done jobs and a type filter in `jobs list`, `fsck` saying "clean", an unknown
queue named as such, a negative delay refused clearly, handler secrets not needed to inspect, and the
producer client taking the CLI's durations. Against the session's real Redis."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import jobcar
from jobcar import Client, InvalidJob, State, transitions, transport
from jobcar.keys import QueueKeys
from tests.integration.test_cli import cli, write_config
from tests.integration.test_cli_ops import Run, enqueue, lease, make_dead, run_json
from tests.integration.test_cli_ops import run as run  # the fixture, by its name
from tests.servers import RedisServer


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"jobcar {jobcar.__version__}"


def test_check_json_says_ok_or_lists_every_error(tmp_path: Path) -> None:
    good = write_config(tmp_path / "good.yaml", "queues: {a: 1}\nhandlers: {t: {command: [cat]}}\n")
    done = cli("check", "-c", str(good), "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"config": str(good), "ok": True, "errors": [], "handlers": ["t"],
                                       "queues": ["a"]}  # fmt: skip
    bad = write_config(tmp_path / "bad.yaml", "lease: forever\nconcurrency: 0\nhandlers: {t: {command: [cat]}}\n")
    done = cli("check", "-c", str(bad), "--json")
    assert done.returncode == 78
    answer = json.loads(done.stdout)
    assert answer["ok"] is False
    assert [e.split(" ", 2)[1] for e in answer["errors"]] == ["lease:", "concurrency:"]


def test_cancel_and_queue_pause_answer_in_json(run: Run, client: Client) -> None:
    (job_id,) = enqueue(client)
    assert run_json(run, "cancel", job_id) == {"id": job_id, "queue": "default", "result": "canceled",
                                               "state": "canceled"}  # fmt: skip
    (running,) = enqueue(client)
    lease(client, 1)
    assert run_json(run, "cancel", running) == {"id": running, "queue": "default", "result": "cancel_requested",
                                                "state": "active"}  # fmt: skip
    assert run_json(run, "queue", "pause", "default") == {"queue": "default", "paused": True, "changed": True}
    assert run_json(run, "queue", "pause", "default") == {"queue": "default", "paused": True, "changed": False}
    assert run_json(run, "queue", "resume", "default") == {"queue": "default", "paused": False, "changed": True}


def test_dead_requeue_and_purge_one_job_by_id_in_json(run: Run, client: Client) -> None:
    first, second, third = make_dead(client, 3)
    assert run_json(run, "dead", "requeue", first) == {"requeued": {"default": 1}, "problems": []}
    code, out, err = run("dead", "purge", second, "--json")
    assert code == 0
    assert json.loads(out) == {"deleted": {"default": 1}, "problems": []}
    assert err == ""
    assert client.get(second) is None
    dead = client.get(third)
    assert dead is not None
    assert dead.state is State.DEAD, "only the named job is deleted"
    code, out, err = run("dead", "purge", first)
    assert code == 1
    assert "job " + first + " is not dead (pending in default)" in err


def test_jobs_list_done_jobs_while_kept_and_by_type(run: Run, client: Client) -> None:
    keys = QueueKeys.of(client.namespace, "default")
    client.enqueue("t.echo", 1, job_id="kept")
    client.enqueue("t.other", 2, job_id="other")
    for leased in lease(client, 2):
        ack = transitions.ack_call(keys, leased.job.id, leased.token, result=b"ok", retention_ms=60_000)
        assert transport.execute(client.redis, [ack]) == [[1]]
    client.enqueue("t.echo", 3, job_id="waiting")
    done = run_json(run, "jobs", "list", "--state", "done")
    assert isinstance(done, list)
    assert sorted(j["id"] for j in done) == ["kept", "other"]
    assert {j["state"] for j in done} == {"done"}
    done_of_type = run_json(run, "jobs", "list", "--state", "done", "--type", "t.other")
    assert isinstance(done_of_type, list)
    assert [j["id"] for j in done_of_type] == ["other"]
    one = run_json(run, "jobs", "list", "--state", "done", "--limit", "1")
    assert isinstance(one, list)
    assert len(one) == 1
    of_type = run_json(run, "jobs", "list", "--type", "t.echo")
    assert isinstance(of_type, list)
    assert [j["id"] for j in of_type] == ["waiting"], "the four sets by default, then filtered by type"
    shown = run_json(run, "jobs", "show", "kept")
    assert isinstance(shown, dict)
    assert shown["result"] == "ok"


def test_fsck_says_clean_when_clean(run: Run, client: Client) -> None:
    enqueue(client, 2)
    code, out, err = run("fsck")
    assert (code, err) == (0, "")
    assert out.startswith("clean")


def test_stats_of_an_unknown_queue_says_so(run: Run, client: Client) -> None:
    code, out, err = run("stats", "--queue", "nosuch")
    assert (code, out) == (1, "")
    assert "unknown queue nosuch" in err
    code, _, _ = run("stats", "--queue", "low")  # in the config, though no producer used it yet
    assert code == 0


def test_a_negative_delay_is_a_clear_error(config: Path) -> None:
    done = cli("enqueue", "-c", str(config), "t.echo", "{}", "--delay", "-5s")
    assert done.returncode == 2
    assert "argument --delay: duration must not be negative, got '-5s'" in done.stderr
    # After a flag that takes no value too, and for every duration option (they derive from the options).
    done = cli("enqueue", "-c", str(config), "t.echo", "{}", "--json", "--backoff", "-5s")
    assert done.returncode == 2
    assert "argument --backoff: duration must not be negative, got '-5s'" in done.stderr


def test_inspecting_needs_no_handler_secret(tmp_path: Path, redis_server: RedisServer, namespace: str) -> None:
    path = write_config(
        tmp_path / "secrets.yaml",
        f"""\
        redis: {{url: "{redis_server.url}"}}
        namespace: {namespace}
        handlers:
          t:
            url: http://127.0.0.1:8080/jobs
            signing_secret: ${{JOBCAR_TEST_NO_SUCH_SECRET}}
        """,
    )
    environ = {k: v for k, v in os.environ.items() if k != "JOBCAR_TEST_NO_SUCH_SECRET"}
    enqueued = cli("enqueue", "-c", str(path), "t", "{}", env=environ)
    assert enqueued.returncode == 0, enqueued.stderr
    assert cli("stats", "-c", str(path), env=environ).returncode == 0
    refused = cli("check", "-c", str(path), env=environ)
    assert refused.returncode == 78
    assert "JOBCAR_TEST_NO_SUCH_SECRET is not set" in refused.stderr


def test_the_client_takes_durations_as_text_and_names_no_job_number_for_one_job(client: Client) -> None:
    info = client.enqueue("t.echo", 1, delay="30s")
    assert info.state is State.SCHEDULED
    job = client.get(info.id)
    assert job is not None
    assert job.run_at_ms is not None
    assert 29_000 <= job.run_at_ms - job.created_ms <= 31_000
    with pytest.raises(InvalidJob) as caught:
        client.enqueue("t.echo", 1, delay="-5s")
    assert str(caught.value) == "delay: duration must not be negative, got '-5s'"
    with pytest.raises(InvalidJob) as many:
        client.enqueue_many([("t.echo", 1), ("t.echo", 2, {"delay": "soon"})])
    assert str(many.value).startswith("job #1: delay: invalid duration 'soon'")
