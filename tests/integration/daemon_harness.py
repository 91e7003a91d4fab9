"""Real `jobcar run` processes and real HTTP handlers for end-to-end tests.

`DaemonProcess` runs the daemon as a subprocess on a config written by `write_config`, with its JSON
log in a file the tests read; `scrape` reads its /metrics. `HandlerServer` is a threaded HTTP server on
loopback whose routes are plain functions; it records every request it receives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client.parser import text_string_to_metric_families

from jobcar.job import Job, State
from tests.integration.driver import QueueDriver
from tests.servers import wait_for

Route = Callable[["Received"], tuple[int, dict[str, str], bytes]]


def write_config(directory: Path, redis_url: str, namespace: str, handlers: dict[str, Any], **top: Any) -> Path:
    """A config file (JSON is YAML) with test-friendly defaults: short lease, quick drain."""
    config = {
        "redis": {"url": redis_url},
        "namespace": namespace,
        "lease": "3s",
        "shutdown_timeout": "10s",
        "log_format": "json",
        "listen": "127.0.0.1:0",  # tests run daemons side by side: never the fixed default port
        "log_level": "debug",
        "defaults": {"timeout": "10s", "max_attempts": 3, "backoff": {"base": "50ms", "max": "200ms"}},
        "handlers": handlers,
        **top,
    }
    path = directory / f"jobcar-{namespace}.yaml"
    path.write_text(json.dumps(config, indent=2))
    return path


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST to a daemon's API: (status, the JSON answer), for error statuses too."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


class DaemonProcess:
    #: Every daemon started and not yet stopped: `stop_leftovers` ends them after each test, so a test that
    #: fails half-way never leaves a daemon running into the next tests (or stopped by SIGSTOP).
    _running: ClassVar[set[DaemonProcess]] = set()

    def __init__(self, config_path: Path, env: dict[str, str] | None = None) -> None:
        self.config_path = config_path
        self.log_path = config_path.with_suffix(f".{time.monotonic_ns()}.log")
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, *, wait_ready: bool = True) -> DaemonProcess:
        with open(self.log_path, "wb") as log:
            # Its own session: signals meant for the test run never reach it, only the ones we send.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jobcar.cli", "run", "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        DaemonProcess._running.add(self)
        if wait_ready:
            self.wait_for_log("jobcar running", timeout=30)
        return self

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                out.append({"msg": raw, "level": "raw"})
        return out

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_for_log(self, fragment: str, timeout: float = 20) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            if self.process is not None and self.process.poll() is not None and not found:
                found.extend(line for line in self.lines() if fragment in line.get("msg", ""))
                if not found:
                    raise AssertionError(f"daemon exited ({self.process.returncode}):\n{self.log_tail()}")
            found.extend(line for line in self.lines() if fragment in line.get("msg", ""))
            return bool(found)

        try:
            wait_for(seen, timeout=timeout, what=f"log line {fragment!r}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- daemon log tail ---\n{self.log_tail()}") from None
        return found[0]

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """Terminate (drain) and, if it does not go, kill. Idempotent; used by fixtures."""
        DaemonProcess._running.discard(self)
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    @classmethod
    def stop_leftovers(cls) -> None:
        for daemon in list(cls._running):
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGCONT)  # a test that failed while it was stopped
            daemon.stop()


def listen_url(daemon: DaemonProcess) -> str:
    """The base URL of the daemon's API, from its log."""
    line = daemon.wait_for_log("listening on")
    return str(line["msg"].removeprefix("listening on "))


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed (not grepped): (name, sorted labels) -> value."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sample with exactly these labels; NaN when there is none (it compares false with anything)."""
    return samples.get((name, tuple(sorted(labels.items()))), float("nan"))


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)


class HandlerServer:
    """A real HTTP handler on 127.0.0.1; unknown paths answer 404."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.received: list[Received] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.do_POST()

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                req = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                with outer._lock:
                    outer.received.append(req)
                route = outer.routes.get(self.path)
                status, headers, body = route(req) if route else (404, {}, b"no such route")
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.base_url + path

    def requests_to(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]


def answer_ok(req: Received) -> tuple[int, dict[str, str], bytes]:
    """A route that answers every job 200 "ok"."""
    return 200, {}, b"ok"


class Gauge:
    """A handler route that holds each request `seconds` and records how many it held at once, over time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.timeline: list[tuple[float, int]] = []  # (monotonic time, requests held) at each change
        self.done: list[Received] = []

    def __call__(self, req: Received) -> tuple[int, dict[str, str], bytes]:
        self.enter()
        time.sleep(self.seconds)
        self.leave(req)
        return 200, {}, b"ok"

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.timeline.append((time.monotonic(), self.now))

    def leave(self, req: Received) -> None:
        with self.lock:
            self.now -= 1
            self.timeline.append((time.monotonic(), self.now))
            self.done.append(req)

    def finished_ids(self) -> set[str]:
        with self.lock:
            return {r.headers["jobcar-job-id"] for r in self.done}


@contextmanager
def handler_server() -> Iterator[HandlerServer]:
    server = HandlerServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


def wait_gone(q: QueueDriver, job_id: str, daemon: DaemonProcess, timeout: float = 20) -> None:
    """Wait until the job finished successfully (its hash is deleted); fail with the daemon's log tail."""
    try:
        wait_for(lambda: q.job(job_id) is None, timeout=timeout, what=f"job {job_id} to finish")
    except TimeoutError:
        raise AssertionError(f"job {job_id}: {q.job(job_id)}\n{daemon.log_tail()}") from None


def wait_state(q: QueueDriver, job_id: str, state: State, daemon: DaemonProcess, timeout: float = 20) -> Job:
    """Wait until the job is in `state` and return it; fail with the job and the daemon's log tail."""
    try:
        wait_for(lambda: (job := q.job(job_id)) is not None and job.state is state, timeout=timeout,
                 what=f"job {job_id} to be {state}")  # fmt: skip
    except TimeoutError:
        raise AssertionError(f"job {job_id}: {q.job(job_id)}\n{daemon.log_tail()}") from None
    job = q.job(job_id)
    assert job is not None
    return job
