"""The example handlers in handlers/ (sh, Node, Python) driven by a real `jobcar run`: every outcome of the
protocol, idempotency on redelivery, and request signing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobcar import State
from jobcar.executors.http import sign
from tests.integration.conftest import StartDaemon
from tests.integration.daemon_harness import wait_state
from tests.integration.driver import QueueDriver
from tests.servers import stop_process, wait_for

#: The same on every server (it tests the example handlers): not run again on the fallback server (Makefile).
pytestmark = pytest.mark.one_server

ROOT = Path(__file__).resolve().parents[2]
RESIZE_SH = ROOT / "handlers" / "sh" / "resize.sh"
SERVERS = {
    "node": ["node", str(ROOT / "handlers" / "node" / "server.js")],
    "python": [sys.executable, str(ROOT / "handlers" / "python" / "server.py")],
}
# Node.js is on every machine of this project's kind; where it is missing these tests fail with a
# FileNotFoundError naming `node` (a skip would hide an untested handler).
HTTP_KINDS = ["node", "python"]


@dataclass
class ExampleServer:
    process: subprocess.Popen[bytes]
    port: int
    work_log: Path
    stderr_path: Path

    def url(self, job_type: str) -> str:
        return f"http://127.0.0.1:{self.port}/jobs/{job_type}"

    def work(self) -> list[str]:
        return self.work_log.read_text().splitlines() if self.work_log.exists() else []


StartServer = Callable[..., ExampleServer]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start an example HTTP handler on a free port (PORT=0) and read the port from its first line."""
    started: list[ExampleServer] = []

    def start(kind: str, secret: str | None = None) -> ExampleServer:
        name = f"{kind}-{len(started)}"
        env = {**os.environ, "PORT": "0", "WORK_LOG": str(tmp_path / f"{name}.work.log")}
        env.pop("JOBCAR_SIGNING_SECRET", None)
        if secret is not None:
            env["JOBCAR_SIGNING_SECRET"] = secret
        stderr_path = tmp_path / f"{name}.stderr"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(SERVERS[kind], stdout=subprocess.PIPE, stderr=stderr, env=env)
        server = ExampleServer(process, 0, Path(env["WORK_LOG"]), stderr_path)
        started.append(server)
        assert process.stdout is not None
        line = process.stdout.readline().decode()  # EOF (a crash) ends the wait too
        assert line.startswith("listening on "), f"{kind} server: {line!r} {stderr_path.read_text()}"
        server.port = int(line.split()[-1])
        return server

    yield start
    for server in started:
        stop_process(server.process)
        assert server.process.stdout is not None
        server.process.stdout.close()


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request as jobcar would send it (a redelivery, a forgery...): status and body."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


# --- sh: handlers/sh/resize.sh ---------------------------------------------------------------------------


def resize_handler(state_dir: Path) -> dict[str, Any]:
    return {
        "command": ["sh", str(RESIZE_SH)],
        "permanent_exit_codes": [65],
        "env": {"HANDLER_STATE_DIR": str(state_dir)},
    }


def test_sh_success_permanent_and_temporary_failures(tmp_path: Path, start_daemon: StartDaemon, q: QueueDriver) -> None:
    daemon = start_daemon({"image.resize": resize_handler(tmp_path / "state")}, result_ttl="1h")
    ok = q.enqueue("image.resize", {"image": "cat.png", "width": 320})
    bad = q.enqueue("image.resize", {"image": "cat.png"})
    flaky = q.enqueue("image.resize", {"image": "dog.jpg", "width": 64, "fail_attempts": 1})

    job = wait_state(q, ok.id, State.DONE, daemon)
    assert json.loads(job.result) == {"image": "cat.png", "width": 320, "output": "cat.320w.png", "attempt": 1}

    job = wait_state(q, bad.id, State.DEAD, daemon)
    assert job.attempt == 1, "exit 65 is listed in permanent_exit_codes: no retry"
    assert "exit code 65" in job.last_error
    assert "cannot process payload" in job.last_error

    job = wait_state(q, flaky.id, State.DONE, daemon)
    assert job.attempt == 2
    assert json.loads(job.result)["output"] == "dog.64w.jpg"
    assert "exit code 75" in job.errors[0].error
    assert "image store unavailable" in job.errors[0].error
    assert sorted((tmp_path / "state" / "work.log").read_text().splitlines()) == sorted(
        [f"{ok.id} 1", f"{flaky.id} 2"]
    ), "the work ran once per successful job"


def test_sh_redelivery_does_not_redo_the_work(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"PATH": os.environ["PATH"], "HANDLER_STATE_DIR": str(state), "JOBCAR_JOB_ID": "job/1 ü"}
    outputs = []
    for attempt in ("1", "2"):  # the same job delivered twice, e.g. after a lost lease
        run = subprocess.run(
            ["sh", str(RESIZE_SH)], input=b'{"image": "a.png", "width": 10}', capture_output=True,
            env={**env, "JOBCAR_ATTEMPT": attempt}, check=False, timeout=10,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1], "the first result, answered again"
    assert json.loads(outputs[0])["attempt"] == 1, "the first result, answered again"
    assert (state / "work.log").read_text().splitlines() == ["job/1 ü 1"], "the work was done once"


# --- HTTP: handlers/node/server.js and handlers/python/server.py -----------------------------------------


@pytest.mark.parametrize("kind", HTTP_KINDS)
def test_http_success_permanent_and_temporary_failures(
    kind: str, start_server: StartServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    server = start_server(kind)
    daemon = start_daemon({"text.count": {"url": server.url("text.count")}}, result_ttl="1h")
    ok = q.enqueue("text.count", {"text": "three little words"})
    bad = q.enqueue("text.count", {"txt": "no text field"})
    flaky = q.enqueue("text.count", {"text": "two words", "fail_attempts": 1})

    job = wait_state(q, ok.id, State.DONE, daemon)
    assert json.loads(job.result) == {"job_id": ok.id, "type": "text.count", "attempt": 1, "words": 3}

    job = wait_state(q, bad.id, State.DEAD, daemon)
    assert job.attempt == 1, "422 goes to the dead-letter queue without a retry"
    assert "HTTP 422" in job.last_error
    assert "cannot process payload" in job.last_error

    job = wait_state(q, flaky.id, State.DONE, daemon)
    assert job.attempt == 2
    assert json.loads(job.result)["words"] == 2
    assert "HTTP 500" in job.errors[0].error
    assert "temporary failure on attempt 1" in job.errors[0].error
    assert sorted(server.work()) == sorted([f"{ok.id} 1", f"{flaky.id} 2"]), "the work ran once per job"


@pytest.mark.parametrize("kind", HTTP_KINDS)
def test_http_busy_with_retry_after_waits_and_spends_no_attempt(
    kind: str, start_server: StartServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    server = start_server(kind)
    # max_attempts 1: had the 503 spent the attempt, the job would be dead instead of done.
    daemon = start_daemon({"text.count": {"url": server.url("text.count"), "max_attempts": 1}}, result_ttl="1h")
    enqueued = time.monotonic()
    info = q.enqueue("text.count", {"text": "later please", "busy_for": 1})
    job = wait_state(q, info.id, State.DONE, daemon)
    # The second delivery can only come after the first one plus Retry-After: 2.
    assert time.monotonic() - enqueued >= 2
    assert job.attempt == 1
    assert json.loads(job.result)["attempt"] == 1
    assert "HTTP 503" in job.errors[0].error
    assert "Retry-After: 2" in job.errors[0].error


@pytest.mark.parametrize("kind", HTTP_KINDS)
def test_http_redelivery_does_not_redo_the_work(kind: str, start_server: StartServer) -> None:
    server = start_server(kind)
    body = b'{"text": "exactly once"}'
    answers = [
        post(server.url("text.count"), body, {"Jobcar-Job-Id": "job-7", "Jobcar-Attempt": attempt})
        for attempt in ("1", "2")  # the same job delivered twice, e.g. after a lost lease
    ]
    assert answers[0] == answers[1], "the first result, answered again"
    assert answers[0][0] == 200
    assert json.loads(answers[0][1]) == {"job_id": "job-7", "type": "text.count", "attempt": 1, "words": 2}
    assert server.work() == ["job-7 1"], "the work was done once"


@pytest.mark.parametrize("kind", HTTP_KINDS)
def test_http_signature_verified(
    kind: str, start_server: StartServer, start_daemon: StartDaemon, q: QueueDriver
) -> None:
    server = start_server(kind, secret="s3cret")
    daemon = start_daemon(
        {
            "signed.right": {"url": server.url("signed.right"), "signing_secret": "s3cret"},
            "signed.wrong": {"url": server.url("signed.wrong"), "signing_secret": "not-the-secret"},
        }
    )
    right = q.enqueue("signed.right", {"text": "signed and sealed"})
    wrong = q.enqueue("signed.wrong", {"text": "forged"})
    wait_for(lambda: q.job(right.id) is None, timeout=20, what="the signed job to finish")
    job = wait_state(q, wrong.id, State.DEAD, daemon)
    # A 401 is permanent: the job died of the first one, never retried. (Not `attempt == 1`: on a starved
    # machine an attempt may lose its short test lease first, and the job then runs again.)
    assert [e.error for e in job.errors if "HTTP 401" in e.error] == [job.last_error]
    assert "Jobcar-Signature" in job.last_error
    assert server.work() == [f"{right.id} 1"]

    # Directly: unsigned, stale (replayed after the 300 s tolerance) and freshly signed requests.
    body = b'{"text": "direct"}'
    url, headers = server.url("signed.right"), {"Jobcar-Job-Id": "direct-1", "Jobcar-Attempt": "1"}
    assert post(url, body, headers)[0] == 401

    def signed(timestamp: int, signature: str) -> dict[str, str]:
        return {**headers, "Jobcar-Timestamp": str(timestamp), "Jobcar-Signature": signature}

    stale = int(time.time()) - 400
    assert post(url, body, signed(stale, sign("s3cret", stale, body)))[0] == 401
    now = int(time.time())
    assert post(url, body, signed(now, sign("not-the-secret", now, body)))[0] == 401
    rotated = f"{sign('old-secret', now, body)}, {sign('s3cret', now, body)}"  # several v1= values: one must match
    assert post(url, body, signed(now, rotated))[0] == 200
