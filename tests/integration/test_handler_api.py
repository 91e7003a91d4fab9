"""The handler API end to end: a real `jobcar run`, real handlers (a Python program as a command handler, a
threaded HTTP server as an HTTP handler) calling back over HTTP with their attempt's URL and token.

One program, `talk.py`, does what its payload says and writes what it saw (statuses, reasons, attempts) to
files the tests read; each test waits for the job's state, never for time.
"""

from __future__ import annotations

import json
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobcar.attempt_desk import TOKEN_HEADER, URL_HEADER
from jobcar.job import State
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, wait_state
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, wait_for

TALK = textwrap.dedent(
    """
    import json, os, signal, sys, time, urllib.request, urllib.error

    url, token = os.environ["JOBCAR_ATTEMPT_URL"], os.environ["JOBCAR_ATTEMPT_TOKEN"]
    job = json.load(sys.stdin)
    out = job["out"]

    def call(method, path, body=None, raw=None, to=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request((to or url) + path, data=data, method=method,
                                         headers={"Authorization": "Bearer " + token,
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def note(**fields):
        with open(out, "a") as f:
            f.write(json.dumps({"attempt": os.environ["JOBCAR_ATTEMPT"], **fields}) + "\\n")

    mode = job["mode"]
    if mode == "progress":
        note(status=call("POST", "/progress", {"percent": 40, "message": "halfway"})[0])
        note(status=call("POST", "/log", {"lines": ["one", "two", "three", "four", "five", "six", "seven"]})[0])
        status, body = call("PUT", "/steps/big", raw=b"x" * 300)
        note(status=status)
    elif mode == "steps":
        status, body = call("GET", "/steps/first")
        if status == 404:
            with open(job["effects"], "a") as f:
                f.write("first\\n")
            note(status=call("PUT", "/steps/first", raw=b"result-1")[0])
            os.kill(os.getpid(), signal.SIGKILL)  # killed between its steps
        note(skipped=body.decode())
        note(status=call("PUT", "/steps/second", raw=b"result-2")[0])
    elif mode == "snooze-api":
        if not os.path.exists(out):
            note(status=call("POST", "/snooze", {"delay": "100ms"})[0])
            note(after=call("POST", "/progress", {"percent": 1})[0])
        else:
            note(done=True)
    elif mode == "snooze-exit":
        if not os.path.exists(out):
            note(snoozing=True)
            print("100ms")
            sys.exit(75)
        note(done=True)
    elif mode == "lease-lost":
        with open(job["ready"], "w") as f:
            f.write("leased")
        while not os.path.exists(job["go"]):
            time.sleep(0.02)
        status, body = call("POST", "/progress", {"percent": 99})
        note(status=status, body=body.decode())
    elif mode == "cancel":
        while True:
            status, body = call("POST", "/progress", {"percent": 1})
            if status != 200:
                note(status=status, body=body.decode())
                break
            time.sleep(0.02)
        time.sleep(30)
    elif mode == "other-job":
        status, body = call("POST", "/progress", {"percent": 5}, to=url.rsplit("/", 1)[0] + "/" + job["other"])
        note(status=status, body=body.decode())
    elif mode == "extend":
        note(status=call("POST", "/extend", {"by": "4s"})[0])
        time.sleep(2)
    elif mode == "extend-refused":
        status, body = call("POST", "/extend", {"by": "4s"})
        note(status=status, body=body.decode())
    elif mode == "parent":
        if not os.path.exists(out):
            jobs = [{"type": "child", "id": kid, "payload": {}} for kid in job["kids"]]
            if job.get("then"):  # a continuation: runs once the parent is done, not waited for
                jobs.append({"type": "child", "id": job["then"], "payload": {}, "after": [os.environ["JOBCAR_JOB_ID"]]})
            children = {"jobs": jobs}
            note(status=call("POST", "/children", children)[0])
            note(status=call("POST", "/await-children", {})[0])
        else:
            status, body = call("GET", "/children")
            note(children=json.loads(body)["children"])
    """
)


BATCH = textwrap.dedent(
    """
    import json, sys, urllib.request
    for line in sys.stdin:
        job = json.loads(line)
        request = urllib.request.Request(job["attempt_url"] + "/progress", data=b'{"percent": 100}', method="POST",
                                         headers={"Authorization": "Bearer " + job["attempt_token"],
                                                  "Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).read()
        answer = {"id": job["id"], "outcome": "done"}
        if job["payload"].get("snooze"):
            with open(job["payload"]["out"], "a") as f:
                f.write("ran\\n")
            if open(job["payload"]["out"]).read().count("ran") == 1:
                answer = {"id": job["id"], "outcome": "snooze", "delay": 0.1}
        print(json.dumps(answer), flush=True)
    """
)


@pytest.fixture(scope="module")
def talk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("talk") / "talk.py"
    path.write_text(TALK)
    (path.parent / "batch.py").write_text(BATCH)
    return path


def _http_handler(req: Received) -> tuple[int, dict[str, str], bytes]:
    """An HTTP handler that reports progress and keeps a step through its attempt's URL and token."""
    url, token = req.headers[URL_HEADER.lower()], req.headers[TOKEN_HEADER.lower()]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for path, method, body in (("/progress", "POST", b'{"message": "from http"}'), ("/steps/s", "PUT", b"kept")):
        request = urllib.request.Request(url + path, data=body, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status in (200, 201)
    return 200, {}, b"ok"


@pytest.fixture(scope="module")
def web_handler() -> Iterator[str]:
    with handler_server() as server:
        yield server.url("/job", _http_handler)


@pytest.fixture(scope="module")
def daemon(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, talk: Path, web_handler: str
) -> Iterator[DaemonProcess]:
    directory = tmp_path_factory.mktemp("handler-api")
    command = {"command": [sys.executable, str(talk)], "timeout": "20s", "backoff": {"base": "50ms", "max": "50ms"}}
    config = {
        "redis": {"url": redis_server.url},
        "namespace": "handler-api",
        "lease": "3s",
        "shutdown_timeout": "5s",
        "log_format": "json",
        "log_level": "debug",
        "listen": "127.0.0.1:0",
        "result_ttl": "5m",
        "handler_api": {"max_log_lines": 5, "max_step_bytes": 100},
        "handlers": {
            "talk": command,
            "short": {**command, "timeout": "1s", "max_extend": "10s"},
            "child": {"command": [sys.executable, "-c", "print('child')"]},
            "web": {"url": web_handler},
            "batched": {
                "command": [sys.executable, str(talk.parent / "batch.py")],
                "batch": {"max_size": 10, "max_wait": "200ms"},
            },
            "stderr": {
                "command": [
                    sys.executable,
                    "-c",
                    "import json, sys; print(*json.load(sys.stdin)['lines'], sep='\\n', file=sys.stderr)",
                ],
                "log_stderr": True,
            },
        },
    }
    path = directory / "jobcar.yaml"
    path.write_text(json.dumps(config))
    process = DaemonProcess(path).start()
    # One daemon for the module: not among those stopped after each test (this fixture stops it).
    DaemonProcess._running.discard(process)
    yield process
    process.stop()


@pytest.fixture
def hq(r: redis.Redis) -> QueueDriver:
    return QueueDriver(r, "handler-api")


def notes(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(hq: QueueDriver, daemon: DaemonProcess, payload: dict[str, Any], job_type: str = "talk") -> str:
    job_id = hq.enqueue(job_type, payload=json.dumps(payload).encode()).id
    wait_state(hq, job_id, State.DONE, daemon)
    return job_id


def test_progress_log_bounds_and_a_step_too_large(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = run(hq, daemon, {"mode": "progress", "out": str(out)})
    assert [n["status"] for n in notes(out)] == [200, 200, 413]
    progress = json.loads(hq.redis.hget(hq.keys.job(job_id), "progress") or b"{}")
    assert (progress["percent"], progress["message"], progress["attempt"]) == (40, "halfway", 1)
    lines = [json.loads(e)["line"] for e in hq.redis.lrange(hq.keys.log(job_id), 0, -1)]
    assert lines == ["three", "four", "five", "six", "seven"]  # max_log_lines 5: the oldest two dropped
    assert hq.redis.hget(hq.keys.job(job_id), "log_dropped") == b"2"
    assert not hq.redis.exists(hq.keys.steps(job_id))


def test_an_http_handler_finds_its_attempt_in_its_headers(daemon: DaemonProcess, hq: QueueDriver) -> None:
    job_id = run(hq, daemon, {}, job_type="web")
    assert json.loads(hq.redis.hget(hq.keys.job(job_id), "progress") or b"{}")["message"] == "from http"
    assert (hq.redis.hget(hq.keys.steps(job_id), "s") or b"").endswith(b" kept")


def test_a_retry_after_a_kill_skips_the_finished_step(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out, effects = tmp_path / "out", tmp_path / "effects"
    job_id = run(hq, daemon, {"mode": "steps", "out": str(out), "effects": str(effects)})
    assert effects.read_text() == "first\n"  # done once, by the killed attempt
    seen = notes(out)
    assert seen[0] == {"attempt": "1", "status": 201}
    assert seen[1] == {"attempt": "2", "skipped": "result-1"}
    assert sorted(hq.redis.hkeys(hq.keys.steps(job_id))) == [b"first", b"second"]


@pytest.mark.parametrize("mode", ["snooze-api", "snooze-exit"])
def test_a_snooze_spends_no_attempt(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path, mode: str) -> None:
    out = tmp_path / "out"
    job_id = run(hq, daemon, {"mode": mode, "out": str(out)})
    seen = notes(out)
    assert [n["attempt"] for n in seen][-1] == "1"  # it ran again as attempt 1
    if mode == "snooze-api":
        assert (seen[0]["status"], seen[1]["after"]) == (202, 409)  # answered: later calls are refused
    assert hq.redis.hget(hq.keys.job(job_id), "deferrals") == b"1"


def test_a_handler_that_lost_its_lease_writes_nothing(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    payload = {"mode": "lease-lost", "out": str(out), "ready": str(ready), "go": str(go)}
    job_id = hq.enqueue("talk", payload=json.dumps(payload).encode()).id
    wait_for(ready.exists, timeout=20, what="the handler running")
    hq.redis.hset(hq.keys.job(job_id), "token", "taken-by-another-daemon")  # as if reaped and leased elsewhere
    go.write_text("go")
    wait_for(lambda: bool(notes(out)), timeout=20, what="the handler's call")
    assert notes(out)[0]["status"] == 409
    assert "lease" in notes(out)[0]["body"]
    assert hq.redis.hget(hq.keys.job(job_id), "progress") is None


def test_a_canceled_jobs_handler_is_refused(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = hq.enqueue("talk", payload=json.dumps({"mode": "cancel", "out": str(out)}).encode()).id
    wait_for(lambda: hq.redis.hget(hq.keys.job(job_id), "progress") is not None, timeout=20, what="progress")
    hq.redis.hset(hq.keys.job(job_id), "cancel", "1")  # what `jobcar jobs cancel` does to an active job
    wait_for(lambda: bool(notes(out)), timeout=20, what="the refused call")
    assert notes(out)[0]["status"] == 409
    assert "canceled" in notes(out)[0]["body"]
    wait_state(hq, job_id, State.CANCELED, daemon)


def test_a_token_of_one_job_is_refused_for_another(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    waiting = {"mode": "lease-lost", "out": str(tmp_path / "o"), "ready": str(ready), "go": str(go)}
    other = hq.enqueue("talk", payload=json.dumps(waiting).encode()).id
    wait_for(ready.exists, timeout=20, what="the other job running")
    run(hq, daemon, {"mode": "other-job", "out": str(out), "other": other})
    assert notes(out)[0]["status"] == 401
    assert hq.redis.hget(hq.keys.job(other), "progress") is None
    go.write_text("go")
    wait_state(hq, other, State.DONE, daemon)


def test_extend_moves_the_timeout(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = run(hq, daemon, {"mode": "extend", "out": str(out)}, job_type="short")  # timeout 1s, runs 2s
    assert notes(out) == [{"attempt": "1", "status": 200}]
    assert hq.redis.hget(hq.keys.job(job_id), "attempt") == b"1"


def test_extend_is_refused_without_max_extend(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(hq, daemon, {"mode": "extend-refused", "out": str(out)})
    (seen,) = notes(out)
    assert seen["status"] == 409
    assert "handlers.talk.max_extend is 0" in seen["body"]


def test_a_parent_waits_for_its_children(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kids = [f"kid-{tmp_path.name}-{n}" for n in range(2)]
    job_id = run(hq, daemon, {"mode": "parent", "out": str(out), "kids": kids})
    # The first run's last note may come after the second run's: it was answered (202) as it released the job.
    wait_for(lambda: len(notes(out)) == 3, timeout=20, what="the first run's last note")
    seen = notes(out)
    assert [n["status"] for n in seen if "status" in n] == [201, 202]
    (again,) = [n for n in seen if "children" in n]
    assert {c["id"]: c["state"] for c in again["children"]} == dict.fromkeys(kids, "done")
    assert again["attempt"] == "1"  # waiting spent no attempt
    for kid in kids:
        assert hq.redis.hget(hq.keys.job(kid), "parent") == f"default/{job_id}".encode()


def test_a_parent_does_not_wait_for_its_continuation(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kid, then = f"kid-{tmp_path.name}", f"then-{tmp_path.name}"
    job_id = run(hq, daemon, {"mode": "parent", "out": str(out), "kids": [kid], "then": then})
    wait_state(hq, then, State.DONE, daemon)  # after its parent, which waited for its other child only
    (again,) = [n for n in notes(out) if "children" in n]
    assert {c["id"]: c["state"] for c in again["children"]} == {kid: "done", then: "waiting"}
    assert hq.redis.hget(hq.keys.job(then), "parent") == f"default/{job_id}".encode()


def test_no_route_answers_without_a_token(daemon: DaemonProcess) -> None:
    base = daemon.wait_for_log("listening on")["msg"].removeprefix("listening on ")
    request = urllib.request.Request(base + "/v1/attempts/nope/progress", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 401


def test_each_job_of_a_batch_has_its_own_attempt(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    plain = hq.enqueue("batched", {"n": 1}).id
    snoozing = hq.enqueue("batched", {"snooze": True, "out": str(out)}).id
    wait_state(hq, plain, State.DONE, daemon)
    wait_state(hq, snoozing, State.DONE, daemon)
    for job_id in (plain, snoozing):
        assert json.loads(hq.redis.hget(hq.keys.job(job_id), "progress") or b"{}")["percent"] == 100
    assert out.read_text().count("ran") == 2  # the batch answer snoozed it once...
    assert hq.redis.hget(hq.keys.job(snoozing), "attempt") == b"1"  # ...without spending an attempt


def test_a_commands_stderr_goes_to_the_log(daemon: DaemonProcess, hq: QueueDriver) -> None:
    job_id = run(hq, daemon, {"lines": ["to the log", "and more"]}, job_type="stderr")
    lines = [json.loads(e)["line"] for e in hq.redis.lrange(hq.keys.log(job_id), 0, -1)]
    assert lines == ["to the log", "and more"]


def test_many_stderr_lines_keep_the_newest(daemon: DaemonProcess, hq: QueueDriver) -> None:
    job_id = run(hq, daemon, {"lines": [f"line {n}" for n in range(5000)]}, job_type="stderr")
    lines = [json.loads(e)["line"] for e in hq.redis.lrange(hq.keys.log(job_id), 0, -1)]
    assert lines == [f"line {n}" for n in range(4995, 5000)]  # max_log_lines 5
    assert hq.redis.hget(hq.keys.job(job_id), "log_dropped") == b"4995"


def test_an_id_that_needs_quoting_in_the_url(daemon: DaemonProcess, hq: QueueDriver, tmp_path: Path) -> None:
    out = tmp_path / "out"
    odd = "a/b?c%d#é"
    hq.enqueue("talk", json.dumps({"mode": "progress", "out": str(out)}).encode(), job_id=odd)
    wait_state(hq, odd, State.DONE, daemon)
    assert [n["status"] for n in notes(out)] == [200, 200, 413]
