"""The quickstart works as shipped: its config passes `jobcar check`, and its two example handlers do
what the config expects of them (the shell one reads stdin and exits 0; the HTTP one answers 200)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcar.cli import main
from jobcar.config import load_config
from jobcar.config_types import CommandHandler, HttpHandler

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "config" / "quickstart.yaml"


def test_jobcar_check_passes_on_the_quickstart(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-c", str(QUICKSTART)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"{QUICKSTART}: ok (2 handlers, 1 queue)\n", "")


def test_quickstart_runs_the_example_handlers() -> None:
    config = load_config(QUICKSTART, environ={})
    assert config.redis.url == "embedded"
    assert (config.namespace, config.queues, config.listen) == ("jobcar", {"default": 1}, "127.0.0.1:9321")
    shell, http = config.handlers["hello.shell"], config.handlers["hello.http"]
    assert isinstance(shell, CommandHandler)
    assert shell.command == ("sh", "handlers/quickstart/hello.sh")
    assert (ROOT / shell.command[1]).is_file()  # relative to the repository root, where `make run` runs
    assert isinstance(http, HttpHandler)
    assert http.url == "http://127.0.0.1:8089/jobs/hello"


def test_hello_sh_reads_the_payload_and_succeeds() -> None:
    done = subprocess.run(
        ["sh", "handlers/quickstart/hello.sh"],
        cwd=ROOT,
        input=b'{"name": "world"}',
        capture_output=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "JOBCAR_JOB_ID": "job-1", "JOBCAR_ATTEMPT": "2"},
        timeout=30,
    )
    assert done.returncode == 0, done
    assert done.stdout == b'hello from job job-1, attempt 2: {"name": "world"}\n'
    assert b"job job-1" in done.stderr


@pytest.fixture
def hello_http() -> Iterator[tuple[subprocess.Popen[str], str]]:
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "handlers" / "quickstart" / "hello_http.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    banner = server.stdout.readline()  # printed once the socket listens
    base = banner.rsplit(" ", 1)[-1].strip().removesuffix("/jobs/hello")
    assert base.startswith("http://127.0.0.1:"), banner
    yield server, base
    server.terminate()
    server.wait(timeout=30)
    server.stdout.close()


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def test_hello_http_answers_the_job_and_404_elsewhere(hello_http: tuple[subprocess.Popen[str], str]) -> None:
    server, base = hello_http
    headers = {"Content-Type": "application/json", "Jobcar-Job-Id": "job-7", "Jobcar-Attempt": "1"}
    assert post(f"{base}/jobs/hello", b'{"name": "http"}', headers) == 200
    assert server.stdout is not None
    assert server.stdout.readline() == 'hello_http: job job-7, attempt 1: {"name": "http"}\n'
    assert post(f"{base}/jobs/other", b"{}", headers) == 404
    try:
        urllib.request.urlopen(f"{base}/jobs/hello", timeout=30).close()
        status = 200
    except urllib.error.HTTPError as exc:
        exc.close()
        status = exc.code
    assert status == 404
