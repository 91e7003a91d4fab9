"""The handler API's example handlers (handlers/sh/{progress,steps,snooze}.sh, handlers/node/talkback.js,
handlers/python/talkback.py) run for real: one `jobcar run` for the module, calling them as commands and
over HTTP, with what they say read back from Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from jobcar import State
from tests.integration.daemon_harness import DaemonProcess, wait_state, write_config
from tests.integration.driver import QueueDriver
from tests.servers import RedisServer, stop_process, wait_for

#: The same on every server (it tests the example handlers): not run again on the fallback server (Makefile).
pytestmark = pytest.mark.one_server

ROOT = Path(__file__).resolve().parents[2]
SH = ROOT / "handlers" / "sh"
SERVERS = {
    "node": ["node", str(ROOT / "handlers" / "node" / "talkback.js")],
    "python": [sys.executable, str(ROOT / "handlers" / "python" / "talkback.py")],
}
LANGUAGES = ["sh", *SERVERS]


@dataclass
class World:
    """The module's daemon, its handlers and where their side effects land."""

    daemon: DaemonProcess
    q: QueueDriver
    redis: redis.Redis
    directory: Path

    def effects(self, language: str) -> list[str]:
        path = self.directory / language / "effects.log"
        return path.read_text().splitlines() if path.exists() else []

    def log(self, job_id: str) -> list[dict[str, object]]:
        return [json.loads(entry) for entry in self.redis.lrange(self.q.keys.log(job_id), 0, -1)]

    def field(self, job_id: str, name: str) -> bytes | None:
        value = self.redis.hget(self.q.keys.job(job_id), name)
        return value if isinstance(value, bytes) else None


def start_server(kind: str, directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """An example HTTP handler on a free port (PORT=0): its port is the first line it prints."""
    env = {**os.environ, "PORT": "0", "WORK_LOG": str(directory / "effects.log")}
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "stderr", "wb") as stderr:
        process = subprocess.Popen(SERVERS[kind], stdout=subprocess.PIPE, stderr=stderr, env=env)
    assert process.stdout is not None
    line = process.stdout.readline().decode()  # EOF (a crash) ends the wait too
    assert line.startswith("listening on "), f"{kind}: {line!r} {(directory / 'stderr').read_text()}"
    return process, int(line.split()[-1])


@pytest.fixture(scope="module")
def world(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("handler-api-examples")
    namespace = f"t{uuid.uuid4().hex[:12]}"
    servers = {kind: start_server(kind, directory / kind) for kind in SERVERS}
    handlers: dict[str, object] = {
        "sh.report": {"command": ["sh", str(SH / "progress.sh")]},
        "sh.steps": {
            "command": ["sh", str(SH / "steps.sh")],
            "env": {"HANDLER_STATE_DIR": str(directory / "sh")},
        },
        # One attempt: a snooze that spent it would leave the job dead.
        "sh.snooze": {"command": ["sh", str(SH / "snooze.sh")], "max_attempts": 1},
    }
    for kind, (_, port) in servers.items():
        base = f"http://127.0.0.1:{port}"
        handlers[f"{kind}.report"] = {"url": f"{base}/report"}
        handlers[f"{kind}.steps"] = {"url": f"{base}/steps"}
        handlers[f"{kind}.snooze"] = {"url": f"{base}/snooze", "max_attempts": 1}
    config = write_config(directory, redis_server.url, namespace, handlers, result_ttl="1h", concurrency=8)
    daemon = DaemonProcess(config).start()
    # The module's daemon outlives each test: the autouse fixture that stops every daemon after each test
    # must not see it (it is stopped below).
    DaemonProcess._running.discard(daemon)
    client = redis_server.client()
    try:
        yield World(daemon, QueueDriver(client, namespace), client, directory)
    finally:
        daemon.stop()
        client.close()
        for process, _ in servers.values():
            stop_process(process)
            assert process.stdout is not None
            process.stdout.close()


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_long_job_reports_progress_and_logs_lines(language: str, world: World) -> None:
    info = world.q.enqueue(f"{language}.report", {"items": 3, "seconds_per_item": 0})
    job = wait_state(world.q, info.id, State.DONE, world.daemon)
    assert job.attempt == 1
    assert json.loads(job.result or b"null") == {"items": 3}
    progress = json.loads(world.field(info.id, "progress") or b"null")
    assert progress["percent"] == 100
    assert progress["message"] == "3 of 3 items"
    assert progress["attempt"] == 1
    lines = world.log(info.id)
    assert [entry["line"] for entry in lines] == [f"item {i} of 3 done" for i in (1, 2, 3)]
    assert {entry["attempt"] for entry in lines} == {1}


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_job_killed_between_steps_skips_the_finished_one(language: str, world: World) -> None:
    order = f"{language}-{uuid.uuid4().hex[:8]}"
    info = world.q.enqueue(f"{language}.steps", {"order": order, "die_after_first_step": True})
    job = wait_state(world.q, info.id, State.DONE, world.daemon)
    assert job.attempt == 2, "the first attempt died between the steps"
    if language == "sh":
        assert "killed by signal SIGKILL" in job.errors[0].error
    seat = f"seat-{order}-1"
    assert json.loads(job.result or b"null") == {
        "order": order, "seat": seat, "receipt": f"paid-{seat}", "attempt": 2
    }, "the seat the first attempt reserved, read back"  # fmt: skip
    mine = [line for line in world.effects(language) if order in line]
    assert mine == [f"reserve {order} 1", f"charge {order} {seat}"], "each side effect happened once"
    steps = world.redis.hgetall(world.q.keys.steps(info.id))
    assert set(steps) == {b"reserve", b"charge"}
    lines = [(entry["attempt"], entry["line"]) for entry in world.log(info.id)]
    assert lines == [
        (1, "step reserve: done"), (2, "step reserve: kept by an earlier attempt, skipped"), (2, "step charge: done")
    ]  # fmt: skip


@pytest.mark.parametrize(("language", "via"), [("sh", "exit"), ("sh", "api"), ("node", "api"), ("python", "api")])
def test_a_snoozing_job_comes_back_without_spending_an_attempt(
    language: str, via: str, world: World, tmp_path: Path
) -> None:
    wanted = tmp_path / "export.csv"
    info = world.q.enqueue(f"{language}.snooze", {"file": str(wanted), "delay": "100ms", "via": via})

    # Twice: the handler allows one attempt, which a snooze that spent it would have used up.
    wait_for(lambda: int(world.field(info.id, "deferrals") or 0) >= 2, timeout=20, what=f"{info.id} to snooze twice")
    wanted.write_text("a\nb\n")
    job = wait_state(world.q, info.id, State.DONE, world.daemon)
    assert job.attempt == 1
    assert json.loads(job.result or b"null") == {"file": str(wanted), "lines": 2, "attempt": 1}
    assert job.errors[0].error == "snoozed by its handler for 0.1s"
