"""Poison input, injection, leakage and exposure against a real `jobcar run` (guarantees 12, 14, 15 of
docs/delivery-semantics.md), end to end.

Every daemon here runs the way a careful deployment would: Redis behind `requirepass`, the API behind a
bearer token, both given to the daemon through its environment (with other secrets that must never reach a
handler: AWS_SECRET_ACCESS_KEY, JOBCAR_TEST_SECRET). Jobs go in through all three doors (the HTTP API, the
Python client, the CLI) to a command handler that records what it received on stdin and in its environment.
The pieces are unit-tested elsewhere (tests/integration/test_api.py, test_command_executor.py); here they are
proven together, across process boundaries, and every test ends by reading the daemon's whole log for secrets.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobcar import Client, State
from jobcar.errors import PayloadTooLarge
from jobcar.job import Job
from tests.integration.daemon_harness import DaemonProcess, wait_state, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer

API_TOKEN = "tok-" + secrets.token_hex(16)
REDIS_PASSWORD = "pw-" + secrets.token_hex(16)
ROTATED_PASSWORD = "pw2-" + secrets.token_hex(16)
TEST_SECRET = "sec-" + secrets.token_hex(16)
AWS_SECRET = "aws-" + secrets.token_hex(16)
GUESSED_TOKEN = "guess-" + secrets.token_hex(16)
#: In every payload: it may reach a handler, never a log line.
MARKER = "payload-marker-" + secrets.token_hex(8)
#: The daemon's environment: the secrets it needs (named in its config) and some it must keep to itself.
DAEMON_ENV = {
    "JOBCAR_API_TOKEN": API_TOKEN,
    "JOBCAR_REDIS_PASSWORD": REDIS_PASSWORD,
    "JOBCAR_TEST_SECRET": TEST_SECRET,
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
}
TEN_MIB = 10 * 1024 * 1024
#: Not UTF-8 (a lone continuation byte, an overlong form, an encoded surrogate, 0xff) with NULs throughout.
RAW = b"\x00\xff\xfe\x80 " + MARKER.encode() + b" \xc3\x28 \xc0\xaf \xed\xa0\x80 \x00\x00 end\x00"

#: The one handler program: records stdin and its environment per attempt, then behaves as its job type says.
HANDLER = """\
import hashlib, json, os, sys
data = sys.stdin.buffer.read()
job_id = os.environ["JOBCAR_JOB_ID"].encode("utf-8", "surrogateescape")
stem = os.path.join(sys.argv[1], hashlib.sha256(job_id).hexdigest()[:32] + "." + os.environ["JOBCAR_ATTEMPT"])
with open(stem + ".env", "w") as f:
    json.dump(dict(os.environ), f)
with open(stem + ".stdin", "wb") as f:  # last: the .env file is complete once this one exists
    f.write(data)
kind = os.environ["JOBCAR_JOB_TYPE"]
if kind == "poison.crash":
    raise RuntimeError("poison attempt " + os.environ["JOBCAR_ATTEMPT"])
if kind == "noisy.fail":
    sys.stderr.buffer.write(b"cannot handle this input: " + data)
    sys.exit(3)
sys.stdout.write("ok")
"""


@pytest.fixture(scope="module")
def secured_redis(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of its own that wants a password (set once it runs: the harness pings it without one)."""
    server = RedisServer(server_binary, tmp_path_factory.mktemp("secured")).start()
    with server.client() as c:
        c.config_set("requirepass", REDIS_PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def r(secured_redis: RedisServer) -> Iterator[redis.Redis]:
    with secured_redis.client(password=REDIS_PASSWORD) as client:
        yield client


@pytest.fixture
def q(r: redis.Redis, namespace: str) -> QueueDriver:
    return QueueDriver(r, namespace)


class Setup:
    """Where the handler writes, and how to start daemons that are stopped after the test."""

    def __init__(self, tmp_path: Path, server: RedisServer, namespace: str) -> None:
        self.tmp_path = tmp_path
        self.server = server
        self.namespace = namespace
        self.out = tmp_path / "runs"
        self.out.mkdir()
        script = tmp_path / "handler.py"
        script.write_text(HANDLER)
        self.command = [sys.executable, str(script), str(self.out)]
        self.config: Path | None = None
        self.daemons: list[DaemonProcess] = []

    def handler(self, **options: Any) -> dict[str, Any]:
        return {"command": self.command, **options}

    def start(self, handlers: dict[str, Any], **top: Any) -> DaemonProcess:
        # The secrets reach the config only through ${VAR}: the file itself holds none.
        url = f"redis://:${{JOBCAR_REDIS_PASSWORD}}@127.0.0.1:{self.server.port}/0"
        self.config = write_config(self.tmp_path, url, self.namespace, handlers, api_token="${JOBCAR_API_TOKEN}",
                                   result_ttl="1h", **top)  # fmt: skip
        assert REDIS_PASSWORD not in self.config.read_text()
        assert API_TOKEN not in self.config.read_text()
        daemon = DaemonProcess(self.config, env=DAEMON_ENV).start()
        self.daemons.append(daemon)
        return daemon

    def runs(self, job_id: str) -> dict[int, tuple[bytes, dict[str, str]]]:
        """attempt -> (stdin, environment) for every run of the job so far."""
        stem = hashlib.sha256(job_id.encode()).hexdigest()[:32]
        found = {}
        for path in self.out.glob(f"{stem}.*.stdin"):
            attempt = int(path.name.split(".")[1])
            found[attempt] = (path.read_bytes(), json.loads(path.with_suffix(".env").read_text()))
        return found

    def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        assert self.config is not None
        command = [sys.executable, "-m", "jobcar.cli", "-c", str(self.config), *args]
        return subprocess.run(command, capture_output=True, timeout=60, check=False, env=DAEMON_ENV)


@pytest.fixture
def setup(tmp_path: Path, secured_redis: RedisServer, namespace: str) -> Iterator[Setup]:
    s = Setup(tmp_path, secured_redis, namespace)
    yield s
    for daemon in s.daemons:
        daemon.stop()
    for daemon in s.daemons:
        assert_nothing_exposed(daemon)


SECRETS = {
    "the api token": API_TOKEN,
    "the redis password": REDIS_PASSWORD,
    "the rotated redis password": ROTATED_PASSWORD,
    "JOBCAR_TEST_SECRET": TEST_SECRET,
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
    "a guessed token": GUESSED_TOKEN,
    "a payload": MARKER,
}


def assert_nothing_exposed(daemon: DaemonProcess) -> None:
    """The daemon's whole log (every line, JSON or not) holds no secret and no payload."""
    text = daemon.log_path.read_bytes()
    assert text, "the daemon logged nothing at all"
    for what, secret in SECRETS.items():
        assert secret.encode() not in text, f"{what} is in the daemon's log {daemon.log_path}"
    for encoded in (base64.b64encode(MARKER.encode()), MARKER.encode().hex().encode()):
        assert encoded not in text, f"an encoded payload is in the daemon's log {daemon.log_path}"


# -- the HTTP API, spoken with the standard library ----------------------------------------------------------


class Api:
    def __init__(self, daemon: DaemonProcess) -> None:
        url = str(daemon.wait_for_log("listening on")["msg"]).removeprefix("listening on http://")
        host, _, port = url.rpartition(":")
        assert host == "127.0.0.1", url
        self.port = int(port)

    def call(self, method: str, path: str, body: bytes | None = None, token: str | None = API_TOKEN) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            # The server may answer (413) before taking the whole body: its answer is still there to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    def enqueue(self, job: dict[str, Any], token: str | None = API_TOKEN) -> tuple[int, Any]:
        return self.call("POST", "/v1/jobs", json.dumps(job).encode(), token=token)

    def created(self, job: dict[str, Any]) -> str:
        status, body = self.enqueue(job)
        assert status == 201, body
        return str(body["id"])


def job_ids_in_redis(q: QueueDriver) -> set[str]:
    prefix = q.keys.job("")
    return {key.decode()[len(prefix) :] for key in q.redis.scan_iter(match=prefix + "*")}


def errors_of(job: Job) -> list[tuple[int, str]]:
    return [(e.attempt, e.error) for e in job.errors]


# -- criterion 12: poison input ---------------------------------------------------------------------------------


def test_poison_input_is_refused_or_dead_lettered_while_good_jobs_flow(setup: Setup, q: QueueDriver) -> None:
    daemon = setup.start({"echo": setup.handler(), "poison.crash": setup.handler(max_attempts=3)}, concurrency=4)
    api = Api(daemon)
    client = Client(q.redis, namespace=setup.namespace)
    good: list[str] = []

    def good_jobs(n: int) -> None:
        """A few good jobs, through the API and the client in turn: the stream that must keep flowing."""
        for k in range(n):
            if k % 2:
                good.append(api.created({"type": "echo", "payload": {"k": len(good), "note": MARKER}}))
            else:
                good.append(client.enqueue("echo", {"k": len(good), "note": MARKER}).id)

    deep = b'{"type": "echo", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    refused_bodies = {
        b"{": "not valid JSON",
        b"not json at all " + MARKER.encode(): "not valid JSON",
        b'{"type": "echo", "payload": "\xff\xfe ' + MARKER.encode() + b'"}': "not valid JSON",  # not UTF-8
        b'{"type": "echo", "payload": "a\x00b"}': "not valid JSON",  # a raw NUL inside a JSON string
        b"\x00" * 64: "not valid JSON",
        b'{"type": "echo", "payload": NaN}': "not valid JSON",
        deep: "not valid JSON",
        b'{"type": "echo", "payload": 1, "bogus": true}': "bogus",
        b'{"type": "echo; rm -rf /", "payload": 1}': "invalid job type",
    }
    ten_mib = MARKER.encode() + b"x" * TEN_MIB
    big_file = setup.tmp_path / "big.json"
    big_file.write_bytes(b'"' + ten_mib + b'"')
    not_json = setup.tmp_path / "not.json"
    not_json.write_bytes(RAW)
    raw_file = setup.tmp_path / "raw.bin"
    raw_file.write_bytes(RAW)

    good_jobs(6)
    for body, message in refused_bodies.items():
        status, answer = api.call("POST", "/v1/jobs", body)
        assert status == 400, (body[:60], status, answer)
        assert message in answer["error"], (body[:60], status, answer)
        good_jobs(1)
    # 10 MiB: the API, the client and the CLI all refuse it before writing anything.
    as_base64 = base64.b64encode(ten_mib).decode()
    for request in ({"type": "echo", "payload": ten_mib.decode()}, {"type": "echo", "payload_base64": as_base64}):
        status, answer = api.enqueue(request)
        assert status == 413, (status, answer)
        assert "error" in answer, (status, answer)
        good_jobs(1)
    with pytest.raises(PayloadTooLarge):
        client.enqueue("echo", ten_mib)
    too_big = setup.cli("enqueue", "echo", f"@{big_file}")
    assert too_big.returncode == 1, too_big.stderr
    assert b"over the limit" in too_big.stderr, too_big.stderr
    bad_json = setup.cli("enqueue", "echo", f"@{not_json}")
    assert bad_json.returncode == 2, bad_json.stderr
    assert b"not UTF-8" in bad_json.stderr, bad_json.stderr
    good_jobs(4)

    # Raw bytes (invalid UTF-8, NULs) are data, not an error: every door takes them, and the handler gets them.
    from_cli = setup.cli("enqueue", "echo", f"@{raw_file}", "--content-type", "application/octet-stream")
    assert from_cli.returncode == 0, from_cli.stderr
    raw_ids = [
        api.created({"type": "echo", "payload_base64": base64.b64encode(RAW).decode()}),
        client.enqueue("echo", RAW).id,
        from_cli.stdout.decode().strip(),
    ]
    good_jobs(4)
    # Unknown types are dead-lettered with the reason, whole (never dropped, never retried).
    unknown = {"no.such.type": api.created({"type": "no.such.type", "payload": {"note": MARKER}}),
               "nobody:handles-this": client.enqueue("nobody:handles-this", RAW).id}  # fmt: skip
    good_jobs(4)
    # A handler that crashes on every attempt: dead after exactly max_attempts, each attempt's error kept.
    crashing = [
        api.created({"type": "poison.crash", "payload": {"note": MARKER}}),
        client.enqueue("poison.crash", RAW).id,
    ]
    good_jobs(10)
    accepted = {*good, *raw_ids, *unknown.values(), *crashing}
    assert len(accepted) == len(good) + 7, "every accepted job got an id of its own"

    for job_id in good:
        wait_state(q, job_id, State.DONE, daemon)
        job = q.job(job_id)
        assert job is not None
        assert job.result == b"ok"
        [(attempt, (stdin, _))] = setup.runs(job_id).items()
        assert attempt == 1
        assert stdin == job.payload
        assert json.loads(stdin)["note"] == MARKER
    for job_id in raw_ids:
        wait_state(q, job_id, State.DONE, daemon)
        assert setup.runs(job_id)[1][0] == RAW, "the payload reached stdin byte for byte"
    for job_type, job_id in unknown.items():
        job = wait_state(q, job_id, State.DEAD, daemon)
        assert errors_of(job) == [(1, f"no handler for type {job_type}")]
        assert setup.runs(job_id) == {}, "nothing ran"
    raw_unknown = q.job(unknown["nobody:handles-this"])
    assert raw_unknown is not None
    assert raw_unknown.payload == RAW, "kept whole for a requeue after a fix"
    for job_id in crashing:
        job = wait_state(q, job_id, State.DEAD, daemon)
        assert job.attempt == 3, errors_of(job)
        assert [e.attempt for e in job.errors] == [1, 2, 3], errors_of(job)
        for attempt, error in errors_of(job):
            assert error.startswith("exit code 1: "), error
            assert f"RuntimeError: poison attempt {attempt}" in error, error
        assert job.errors[-1].error.endswith("(attempts exhausted: 3 of 3)")
        assert sorted(setup.runs(job_id)) == [1, 2, 3], "run exactly max_attempts times"

    # Nothing refused left anything behind: the namespace holds exactly the accepted jobs.
    assert job_ids_in_redis(q) == accepted
    assert q.redis.llen(q.keys.pending) == 0
    assert q.redis.zcard(q.keys.active) == 0
    assert q.redis.zcard(q.keys.scheduled) == 0
    assert q.redis.zcard(q.keys.dead) == 4
    assert daemon.process is not None
    assert daemon.process.poll() is None, "the daemon is still running"
    assert not [line for line in daemon.lines() if line.get("level") in ("error", "critical")], daemon.log_tail()


# -- criterion 14: injection and leakage ---------------------------------------------------------------------------


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a short path (tmp_path can be long)."""
    with tempfile.TemporaryDirectory(prefix="jc") as name:
        yield Path(name)


def test_injection_payloads_reach_stdin_byte_identical_and_nothing_else_runs(
    setup: Setup, q: QueueDriver, short: Path
) -> None:
    daemon = setup.start({"echo": setup.handler()})
    api = Api(daemon)
    markers = [setup.tmp_path / f"pwned-{n}" for n in range(8)]
    m = [str(p) for p in markers]
    vectors = [
        f"; touch {m[0]}",
        f"$(touch {m[1]})",
        f"`touch {m[2]}`",
        f"&& touch {m[3]} || touch {m[3]} | touch {m[3]}",
        f"'\"; touch {m[4]}; echo \"'\n$(touch {m[4]})\r\n",
        f"${{IFS}}$HOME$(touch${{IFS}}{m[5]}) %s %n {{}} \\x00 \\",
        f"{MARKER}\n touch {m[6]}\n",
    ]
    raw_vector = (
        b"\x00; touch " + m[7].encode() + b" \x00$(touch " + m[7].encode() + b")\xff`touch " + m[7].encode() + b"`"
    )
    expected: dict[str, bytes] = {}
    for vector in vectors:
        expected[q.enqueue("echo", vector.encode(), content_type="text/plain").id] = vector.encode()
        expected[api.created({"type": "echo", "payload_base64": base64.b64encode(vector.encode()).decode(),
                              "content_type": "text/plain"})] = vector.encode()  # fmt: skip
        as_json = api.created({"type": "echo", "payload": {"cmd": vector}})
        expected[as_json] = json.dumps({"cmd": vector}, separators=(",", ":"), ensure_ascii=False).encode()
    expected[q.enqueue("echo", raw_vector).id] = raw_vector
    # The job's metadata reaches the handler as environment variables: shell syntax there must stay text too.
    # (An id holds at most 200 characters: its markers live in a short directory.)
    markers += [short / "a", short / "b", short / "c"]
    odd_id = f"id;$(touch${{IFS}}{short}/a)`touch${{IFS}}{short}/b`|touch${{IFS}}{short}/c"
    odd_type = "text/x;$(touch${IFS}" + m[2] + ")`touch${IFS}" + m[2] + "`"
    assert api.created({"id": odd_id, "type": "echo", "payload_base64": "AA==", "content_type": odd_type}) == odd_id
    expected[odd_id] = b"\x00"

    for job_id, payload in expected.items():
        job = wait_state(q, job_id, State.DONE, daemon)
        assert job.payload == payload, "stored as sent"
        [(attempt, (stdin, env))] = setup.runs(job_id).items()
        assert stdin == payload, f"{job_id}: the handler got {stdin!r}, not {payload!r}"
        assert attempt == 1
        assert env["JOBCAR_JOB_ID"] == job_id
    assert setup.runs(odd_id)[1][1]["JOBCAR_CONTENT_TYPE"] == odd_type
    assert [p for p in markers if p.exists()] == [], "a payload or a job field was run by a shell"


def test_the_childs_environment_holds_no_daemon_secret_unless_allow_listed(setup: Setup, q: QueueDriver) -> None:
    daemon = setup.start(
        {
            "echo": setup.handler(),
            "allowed": setup.handler(env_allow=["JOBCAR_TEST_SECRET"], env={"HANDLER_SETTING": "from the config"}),
        }
    )
    plain, allowed = q.enqueue("echo", {"note": MARKER}).id, q.enqueue("allowed", {"note": MARKER}).id
    wait_state(q, plain, State.DONE, daemon)
    wait_state(q, allowed, State.DONE, daemon)
    env = setup.runs(plain)[1][1]
    assert env["JOBCAR_JOB_ID"] == plain
    assert env["JOBCAR_JOB_TYPE"] == "echo"
    assert "PATH" in env
    for name in DAEMON_ENV:
        assert name not in env, f"{name} reached the handler"
    dump = json.dumps(env)
    for secret in (API_TOKEN, REDIS_PASSWORD, TEST_SECRET, AWS_SECRET):
        assert secret not in dump, "a daemon secret reached the handler under another name"

    env = setup.runs(allowed)[1][1]
    assert env["JOBCAR_TEST_SECRET"] == TEST_SECRET, "allow-listed: passed on as it is"
    assert env["HANDLER_SETTING"] == "from the config"
    for name in ("JOBCAR_API_TOKEN", "JOBCAR_REDIS_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
        assert name not in env, f"{name} reached the handler without being allow-listed"
    dump = json.dumps(env)
    for secret in (API_TOKEN, REDIS_PASSWORD, AWS_SECRET):
        assert secret not in dump


# -- criterion 15: exposure ----------------------------------------------------------------------------------------


def test_no_token_password_or_payload_in_the_daemons_log(setup: Setup, q: QueueDriver, r: redis.Redis) -> None:
    """At the default log level, through every path that logs: API refusals, retries, the DLQ, unknown types,
    and Redis refusing the daemon's password (a rotation) then taking it again. The setup fixture greps the log."""
    daemon = setup.start({"echo": setup.handler(), "noisy.fail": setup.handler(max_attempts=2)}, log_level="info")
    api = Api(daemon)
    # Without the token, or with a wrong one, every mutating route is 401 and does nothing.
    victim = api.created({"type": "echo", "payload": {"note": MARKER}, "delay": "1h"})
    for token in (None, GUESSED_TOKEN, API_TOKEN + "x", API_TOKEN[:-1]):
        for method, path, body in (("POST", "/v1/jobs", json.dumps({"type": "echo", "payload": MARKER}).encode()),
                                   ("DELETE", f"/v1/jobs/{victim}", None), ("POST", "/v1/drain", None)):  # fmt: skip
            status, answer = api.call(method, path, body, token=token)
            assert (status, answer) == (401, {"error": "missing or wrong bearer token"}), (method, path, token)
    assert q.where(victim) is State.SCHEDULED, "not canceled"
    # Refused input that holds the payload marker.
    assert api.call("POST", "/v1/jobs", b'{"type": "echo", "payload": "' + MARKER.encode())[0] == 400
    assert api.enqueue({"type": "echo", "payload": MARKER * (TEN_MIB // len(MARKER))})[0] == 413
    # Jobs that succeed, fail with the payload echoed on stderr, and have no handler.
    done = api.created({"type": "echo", "payload": {"note": MARKER}})
    noisy = q.enqueue("noisy.fail", {"note": MARKER}).id
    unknown = api.created({"type": "no.such.type", "payload": {"note": MARKER}})
    wait_state(q, done, State.DONE, daemon)
    failed = wait_state(q, noisy, State.DEAD, daemon)
    assert MARKER in failed.errors[0].error, "the handler's stderr is kept in the job (in Redis), not in the log"
    wait_state(q, unknown, State.DEAD, daemon)

    # The password is rotated under the daemon: its reconnects are refused, then it is given the old one back.
    r.config_set("requirepass", ROTATED_PASSWORD)
    try:
        r.client_kill_filter(_type="normal", skipme=True)
        daemon.wait_for_log("redis unreachable")
    finally:
        r.config_set("requirepass", REDIS_PASSWORD)
    daemon.wait_for_log("redis reachable again")
    after = api.created({"type": "echo", "payload": {"note": MARKER}})
    wait_state(q, after, State.DONE, daemon)

    messages = [str(line.get("msg", "")) for line in daemon.lines()]
    for expected in ("job retried", "job dead", "attempts exhausted", "redis unreachable", "redis reachable again"):
        assert any(expected in message for message in messages), f"nothing logged for {expected!r}: the test is weak"
    assert daemon.process is not None
    assert daemon.process.poll() is None, "the daemon is still running"


def test_the_log_grep_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The exposure check is only as good as its grep: a log that does hold a secret must fail it."""
    log = tmp_path / "daemon.log"
    daemon = DaemonProcess(tmp_path / "unused.yaml")
    daemon.log_path = log
    for secret in (API_TOKEN, REDIS_PASSWORD, MARKER, base64.b64encode(MARKER.encode()).decode()):
        log.write_text(json.dumps({"msg": f"connecting to redis://:{secret}@host"}) + "\n")
        with pytest.raises(AssertionError):
            assert_nothing_exposed(daemon)
