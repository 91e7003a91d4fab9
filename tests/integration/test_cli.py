"""The `jobcar` command line: `check` on bad configs, `enqueue` against a real server, exit codes.

Exit codes are checked on a real subprocess (`python -m jobcar.cli`), as a shell script would see
them; the rest runs `main()` in-process.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobcar import Client, Job
from jobcar.cli import main
from jobcar.embedded import EmbeddedServer
from jobcar.job import State
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, stdin: bytes | None = None, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`jobcar ARGS...` as a real process."""
    environ = {k: v for k, v in os.environ.items() if k != "JOBCAR_CONFIG"}
    # This checkout's package, however the venv installed it.
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "daemon"), environ.get("PYTHONPATH")]))
    environ.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "jobcar.cli", *args],
        input=stdin,
        capture_output=True,
        env=environ,
        cwd=cwd,
        timeout=60,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def write_config(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def get(client: Client, job_id: str) -> Job:
    job = client.get(job_id)
    assert job is not None, f"job {job_id} not found"
    return job


# -- check -------------------------------------------------------------------------------------------

LINE = r"{path}:\d+:\d+ "  # every config error starts with file:line:col


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "namespace: [a, b\nqueues: {default: 1}\n",
            [r"{path}:2:7: expected ',' or ']', but got ':' \(while parsing a flow sequence at line 1, column 12\)"],
            id="yaml-syntax",
        ),
        pytest.param(
            "namespace: x\nnamspace: y\n",
            [r"{path}:2:1 namspace: unknown key \(did you mean 'namespace'\?\)"],
            id="unknown-key",
        ),
        pytest.param(
            "lease: 3x\nshutdown_timeout: -1s\n",
            [
                r"{path}:1:8 lease: invalid duration '3x': use seconds or a number with a unit: .*",
                r"{path}:2:19 shutdown_timeout: duration must not be negative, got '-1s'",
            ],
            id="bad-duration",
        ),
        pytest.param(
            "redis:\n  url: ${JOBCAR_TEST_UNSET_VAR}\n",
            [r"{path}:2:8 redis\.url: environment variable JOBCAR_TEST_UNSET_VAR is not set .*"],
            id="missing-env-var",
        ),
        pytest.param(
            "handlers:\n  img.resize:\n    command: /usr/local/bin/resize --quality 80\n",
            [
                r"{path}:3:14 handlers\.img\.resize\.command: must be an argv list, not a string: jobcar never runs "
                r'a shell; write \["/usr/local/bin/resize", "--quality", "80"\]'
            ],
            id="command-as-string",
        ),
        pytest.param(
            "namspace: y\nlease: 3x\nredis:\n  url: ${JOBCAR_TEST_UNSET_VAR}\nhandlers:\n  a.b: {command: sh -c x}\n",
            [
                r"{path}:1:1 namspace: unknown key .*",
                r"{path}:2:8 lease: invalid duration .*",
                r"{path}:4:8 redis\.url: environment variable JOBCAR_TEST_UNSET_VAR is not set .*",
                r"{path}:6:18 handlers\.a\.b\.command: must be an argv list, not a string: .*",
            ],
            id="every-error-at-once",
        ),
    ],
)
def test_check_reports_every_error_with_its_place(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    done = cli("check", "-c", str(path))
    assert done.returncode == 78, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == len(expected), done.stderr
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern.format(path=re.escape(str(path))), line), line
    assert "Traceback" not in done.stderr


def test_check_ok_and_where_the_config_comes_from(tmp_path: Path, config: Path) -> None:
    assert cli("check", "-c", str(config)).stdout == f"{config}: ok (1 handler, 2 queues)\n"
    # $JOBCAR_CONFIG, else ./jobcar.yaml
    done = cli("check", env={"JOBCAR_CONFIG": str(config)}, cwd=Path("/"))
    assert (done.returncode, done.stdout) == (0, f"{config}: ok (1 handler, 2 queues)\n")
    done = cli("check", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "jobcar.yaml: ok (1 handler, 2 queues)\n")
    # -c before the command works too
    assert cli("-c", str(config), "check").returncode == 0


def test_check_without_a_config_file(tmp_path: Path) -> None:
    done = cli("check", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (78, "jobcar.yaml: no such file\n")


def test_usage_errors_exit_2(config: Path) -> None:
    assert cli().returncode == 2  # no command
    assert cli("frobnicate").returncode == 2
    done = cli("enqueue", "-c", str(config))  # no TYPE
    assert done.returncode == 2
    assert "TYPE" in done.stderr
    assert cli("enqueue", "-c", str(config), "t.echo", "--delay", "3x").returncode == 2
    assert cli("enqueue", "-c", str(config), "t.echo", "--delay", "1s", "--at", "0").returncode == 2
    assert cli("enqueue", "-c", str(config), "t.echo", "--max-attempts", "0").returncode == 2
    assert cli("--help").returncode == 0


# -- enqueue -----------------------------------------------------------------------------------------


def test_enqueue_json_payload_unchanged(config: Path, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "-c", str(config), "t.echo", '{"user": 42,  "x": [1.50]}']) == 0
    out, err = capsys.readouterr()
    job = get(client, out.strip())
    # The producer's bytes are kept as they were written (not re-encoded), with the JSON content type.
    assert (job.type, job.queue, job.state, job.payload) == (
        "t.echo",
        "default",
        State.PENDING,
        b'{"user": 42,  "x": [1.50]}',
    )
    assert job.content_type == "application/json"
    assert err == ""


def test_enqueue_without_payload_is_json_null(config: Path, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "-c", str(config), "t.echo"]) == 0
    assert get(client, capsys.readouterr().out.strip()).payload == b"null"


def test_enqueue_payload_from_a_file(
    tmp_path: Path, config: Path, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = tmp_path / "payload.json"
    payload.write_bytes(b'{"from": "file", "text": "caf\xc3\xa9"}\n')
    assert main(["enqueue", "-c", str(config), "t.echo", f"@{payload}", "--queue", "low"]) == 0
    job = get(client, capsys.readouterr().out.strip())
    assert (job.queue, job.payload) == ("low", payload.read_bytes())

    assert main(["enqueue", "-c", str(config), "t.echo", f"@{tmp_path / 'missing.json'}"]) == 2
    assert "cannot read the payload file" in capsys.readouterr().err


def test_enqueue_payload_from_stdin(config: Path, client: Client) -> None:
    done = cli("enqueue", "-c", str(config), "t.echo", "-", stdin=b"[1, 2, 3]")
    assert done.returncode == 0, done
    assert get(client, done.stdout.strip()).payload == b"[1, 2, 3]"


def test_enqueue_raw_bytes_with_a_content_type(config: Path, client: Client, tmp_path: Path) -> None:
    done = cli("enqueue", "-c", str(config), "t.echo", "-", "--content-type", "text/csv", stdin=b"a,b\n1,2\n")
    assert done.returncode == 0, done
    job = get(client, done.stdout.strip())
    assert (job.payload, job.content_type) == (b"a,b\n1,2\n", "text/csv")


def test_enqueue_delayed_and_at_a_time(config: Path, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "-c", str(config), "t.echo", "{}", "--delay", "10s", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert set(answer) == {"id", "queue", "state", "status"}
    assert (answer["queue"], answer["state"], answer["status"]) == ("default", "scheduled", "created")
    job = get(client, answer["id"])
    assert job.state is State.SCHEDULED
    assert job.run_at_ms is not None
    assert job.run_at_ms - job.created_ms == pytest.approx(10_000, abs=1000)

    later = datetime.now(UTC) + timedelta(hours=2)
    for when in (later.isoformat(), later.strftime("%Y-%m-%dT%H:%M:%SZ"), str(int(later.timestamp()))):
        assert main(["enqueue", "-c", str(config), "t.echo", "{}", "--at", when]) == 0
        job = get(client, capsys.readouterr().out.strip())
        assert job.state is State.SCHEDULED
        assert job.run_at_ms == pytest.approx(later.timestamp() * 1000, abs=1500)

    assert main(["enqueue", "-c", str(config), "t.echo", "{}", "--at", "2030-01-31T09:00:00"]) == 2
    assert "needs a timezone" in capsys.readouterr().err


def test_enqueue_options_are_stored(config: Path, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["enqueue", "-c", str(config), "t.echo", "{}", "--max-attempts", "3", "--timeout", "1m30s"]
    assert main(argv) == 0
    job = get(client, capsys.readouterr().out.strip())
    assert (job.max_attempts, job.timeout_ms) == (3, 90_000)


def test_enqueue_priority_deadline_and_debounce(config: Path, client: Client) -> None:
    first = cli("enqueue", "-c", str(config), "t.echo", "1", "--priority", "4", "--expires-in", "1h", "--debounce",
                "30s", "--debounce-key", "k", "--debounce-max-wait", "2m", "--key", "tenant 7")  # fmt: skip
    assert first.returncode == 0, first
    job = get(client, first.stdout.strip())
    assert (job.priority, job.debounce_key, job.state, job.limit_key) == (4, "k", State.SCHEDULED, "tenant 7")
    assert job.expires_at_ms is not None
    second = cli("enqueue", "-c", str(config), "t.echo", "2", "--debounce", "30s", "--debounce-key", "k")
    assert (second.returncode, second.stdout) == (0, first.stdout)
    assert "debounced into waiting job" in second.stderr
    assert get(client, job.id).payload == b"2"
    refused = cli("enqueue", "-c", str(config), "t.echo", "--priority", "10")
    assert refused.returncode == 2
    assert "must be a whole number from 0 (first) to 9" in refused.stderr


def test_schedules_from_the_command_line(config: Path, client: Client) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return cli("schedules", *args, "-c", str(config))

    made = run("set", "backup", "--type", "t.echo", "--every", "1h", "--payload", '{"full": true}', "--json")
    assert (made.returncode, json.loads(made.stdout)) == (0, {"name": "backup", "result": "created"}), made
    listed = run("list")
    assert listed.returncode == 0, listed
    assert "backup" in listed.stdout
    assert "every 3600s" in listed.stdout
    shown = json.loads(run("show", "backup", "--json").stdout)
    assert (shown["payload"], shown["every_seconds"], shown["origin"]) == ({"full": True}, 3600, "api")
    assert run("pause", "backup").stdout == "schedule backup paused\n"
    assert run("pause", "backup").stdout == "schedule backup already paused\n"
    job_id = run("trigger", "backup").stdout.strip()
    job = get(client, job_id)
    assert (job.schedule, job.payload) == ("backup", b'{"full":true}')
    assert run("resume", "backup").stdout == "schedule backup resumed\n"
    assert run("remove", "backup").stdout == "schedule backup removed\n"
    gone = run("show", "backup")
    assert (gone.returncode, gone.stderr.strip()) == (1, "jobcar: no schedule named 'backup'")
    bad = run("set", "x", "--type", "t", "--cron", "99 * * * *")
    assert bad.returncode == 2
    assert "cron '99 * * * *'" in bad.stderr


def test_enqueue_same_id_twice_is_not_an_error(config: Path, client: Client) -> None:
    first = cli("enqueue", "-c", str(config), "t.echo", '{"n": 1}', "--id", "order-17")
    assert (first.returncode, first.stdout, first.stderr) == (0, "order-17\n", "")
    second = cli("enqueue", "-c", str(config), "t.echo", '{"n": 2}', "--id", "order-17", "--json")
    assert second.returncode == 0, second
    assert json.loads(second.stdout) == {"id": "order-17", "queue": "default", "state": "pending", "status": "exists"}
    assert "already exists" in second.stderr
    assert get(client, "order-17").payload == b'{"n": 1}'  # the first one stands


def test_enqueue_unique_for(config: Path, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["enqueue", "-c", str(config), "t.echo", '{"report": 5}', "--unique-for", "1h"]
    assert main(argv) == 0
    first, err = capsys.readouterr()
    assert err == ""
    assert main(argv) == 0
    second, err = capsys.readouterr()
    assert second == first  # the holder's id
    assert "unique key is held by job" in err
    # A different payload is a different job; an explicit key makes them the same.
    assert main([*argv[:4], '{"report": 6}', "--unique-for", "1h"]) == 0
    assert capsys.readouterr().out != first
    keyed = ["enqueue", "-c", str(config), "t.echo", "--unique-for", "1h", "--unique-key", "nightly"]
    assert main([*keyed, '{"a": 1}']) == 0
    holder = capsys.readouterr().out
    assert main([*keyed, '{"a": 2}']) == 0
    assert capsys.readouterr().out == holder

    assert main(["enqueue", "-c", str(config), "t.echo", "--unique-key", "k"]) == 2
    assert "--unique-key needs --unique-for" in capsys.readouterr().err


def test_enqueue_stores_the_options_its_flags_give(
    config: Path, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["enqueue", "-c", str(config), "t.echo", "--backoff", "1m30s", "--timeout", "2m", "--priority", "3",
            "--after", "other/dep", "--on-dependency-failure", "run", "--id", "flagged"]  # fmt: skip
    assert main(argv) == 0
    job = get(client, "flagged")
    assert (job.backoff_ms, job.timeout_ms, job.priority) == (90_000, 120_000, 3)
    assert (job.after, job.on_dependency_failure) == (("other/dep",), "run")
    assert capsys.readouterr().out == "flagged\n"


def test_enqueue_invalid_json_exits_2(config: Path, client: Client) -> None:
    for payload in ("{user: 42}", "NaN", "not json"):
        done = cli("enqueue", "-c", str(config), "t.echo", payload)
        assert done.returncode == 2, done
        assert done.stdout == ""
        assert done.stderr.startswith("jobcar: the payload is not valid JSON")
        assert len(done.stderr.splitlines()) == 1
    done = cli("enqueue", "-c", str(config), "t.echo", "-", stdin=b"\xff\xfe")
    assert (done.returncode, done.stdout) == (2, "")
    assert "not UTF-8" in done.stderr
    assert client.redis.keys(f"{client.namespace}:*") == []  # nothing was written


def test_enqueue_invalid_job_exits_2(config: Path) -> None:
    done = cli("enqueue", "-c", str(config), "no spaces allowed", "{}")
    assert done.returncode == 2
    assert done.stderr.startswith("jobcar: invalid job type")


def test_enqueue_payload_over_the_limit_exits_1(tmp_path: Path, redis_server: RedisServer, namespace: str) -> None:
    path = write_config(
        tmp_path / "small.yaml",
        f"""\
        redis: {{url: "{redis_server.url}"}}
        namespace: {namespace}
        max_payload_bytes: 16
        """,
    )
    payload = json.dumps({"text": "x" * 100})
    done = cli("enqueue", "-c", str(path), "t.echo", payload)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"jobcar: payload is {len(payload)} bytes, over the limit of 16 bytes\n"


def test_enqueue_notes_a_type_or_queue_the_config_does_not_run(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["enqueue", "-c", str(config), "nobody.handles", "{}", "--queue", "elsewhere"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    assert "no handler for type 'nobody.handles'" in err
    assert "queue 'elsewhere' is not in the queues" in err


def test_enqueue_names_the_near_type_and_with_strict_enqueue_refuses(
    config: Path, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["enqueue", "-c", str(config), "t.ecko", "{}", "--queue", "lw"]) == 0
    err = capsys.readouterr().err
    assert "has no handler for type 't.ecko' (did you mean 't.echo'?)" in err
    assert "queue 'lw' is not in the queues of" in err
    assert "(did you mean 'low'?)" in err
    config.write_text(config.read_text() + "strict_enqueue: true\n")
    assert main(["enqueue", "-c", str(config), "t.ecko", "{}", "--id", "typo"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"jobcar: {config} has no handler for type 't.ecko' (did you mean 't.echo'?)",
        "jobcar: nothing enqueued (strict_enqueue is on)",
    ]
    assert client.get("typo") is None
    assert main(["enqueue", "-c", str(config), "t.echo", "{}"]) == 0


def test_enqueue_with_redis_unreachable_exits_69(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    path = write_config(tmp_path / "away.yaml", f"redis: {{url: 'redis://:secret@127.0.0.1:{port}/0'}}\n")
    started = time.monotonic()
    done = cli("enqueue", "-c", str(path), "t.echo", "{}")
    assert done.returncode == 69, done
    assert done.stdout == ""
    assert done.stderr.startswith(f"jobcar: cannot reach Redis at redis://***@127.0.0.1:{port}/0")
    assert len(done.stderr.splitlines()) == 1
    assert "secret" not in done.stderr
    assert time.monotonic() - started < 30


def test_enqueue_with_a_bad_config_exits_78(tmp_path: Path) -> None:
    path = write_config(tmp_path / "bad.yaml", "lease: forever\n")
    done = cli("enqueue", "-c", str(path), "t.echo", "{}")
    assert done.returncode == 78
    assert done.stderr.startswith(f"{path}:1:8 lease: invalid duration")


async def test_enqueue_to_an_embedded_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    path = write_config(tmp_path / "embedded.yaml", f"redis: {{url: embedded, data_dir: '{data_dir}'}}\n")

    # Not running: the embedded server lives only inside `jobcar run`.
    done = cli("enqueue", "-c", str(path), "t.echo", "{}")
    assert done.returncode == 69, done
    assert "only inside `jobcar run`" in done.stderr
    assert len(done.stderr.splitlines()) == 1

    # Running (as under `jobcar run` on the same data directory): reached through its socket.
    async with EmbeddedServer(data_dir) as server:
        # The command runs its own event loop, as it does from a shell: in a thread of its own here.
        assert await asyncio.to_thread(main, ["enqueue", "-c", str(path), "t.echo", '{"via": "socket"}']) == 0
        job_id = capsys.readouterr().out.strip()
        with Client.from_url(server.url) as client:
            assert get(client, job_id).payload == b'{"via": "socket"}'

    # Stopped again: same answer as before it ever ran.
    assert await asyncio.to_thread(main, ["enqueue", "-c", str(path), "t.echo", "{}"]) == 69
    assert "only inside `jobcar run`" in capsys.readouterr().err
