"""`make run` as a user runs it, from a copy of the quickstart (on free ports): the daemon with its embedded
server and both example handlers come up, a job runs, and a SIGTERM to make (a terminal's `kill`, a
process manager) is passed on: the daemon drains and every process it started is gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from jobcar import Client, State
from tests.servers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # something answered
    except OSError:
        return False


def test_make_run_serves_the_quickstart_and_passes_sigterm_on(tmp_path: Path) -> None:
    listen, handler = free_port(), free_port()
    shutil.copy2(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "config").mkdir()
    config = (ROOT / "config" / "quickstart.yaml").read_text()
    config = config.replace("127.0.0.1:9321", f"127.0.0.1:{listen}").replace(":8089/", f":{handler}/")
    (tmp_path / "config" / "quickstart.yaml").write_text(config)
    shutil.copytree(ROOT / "handlers" / "quickstart", tmp_path / "handlers" / "quickstart")
    http_handler = tmp_path / "handlers" / "quickstart" / "hello_http.py"
    http_handler.write_text(http_handler.read_text().replace("default=8089", f"default={handler}"))
    stamp = VENV / ".installed-runtime"
    assert stamp.exists(), "make test's venv has the runtime stamp: make run installs nothing here"

    env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
    log = (tmp_path / "make.log").open("wb")
    make = subprocess.Popen(["make", "run", f"VENV={VENV}", "-o", str(stamp)], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: b"jobcar running" in (tmp_path / "make.log").read_bytes(), timeout=60,
                 what=f"make run to start the daemon ({tmp_path / 'make.log'})")  # fmt: skip
        output = (tmp_path / "make.log").read_text()
        assert "Client.from_config('config/quickstart.yaml')" in output, "make run says how producers connect"
        os.chdir(tmp_path)  # the embedded server's data directory is relative, as for a user
        try:
            with Client.from_config("config/quickstart.yaml") as client:
                job = client.wait(client.enqueue("hello.http", {"name": "make"}).id, timeout=30)
        finally:
            os.chdir(ROOT)
        assert job is not None
        assert job.state is State.DONE
        # What a newcomer sees: where the dashboard is, with its buttons, and a line for the job that ran.
        output = (tmp_path / "make.log").read_text()
        dashboard = f"http://127.0.0.1:{listen}/ui/"
        assert f"the dashboard at {dashboard}" in output
        with urllib.request.urlopen(dashboard, timeout=10) as page:
            assert "read-write" in page.read().decode()

        def logged_done() -> bool:
            return any(
                "job done" in line and job.id in line for line in (tmp_path / "make.log").read_text().splitlines()
            )

        wait_for(logged_done, timeout=30, what="a log line for the job that ran")

        make.send_signal(signal.SIGTERM)
        # make passes the signal on to its recipe and ends by it (-SIGTERM); the recipe's shell passes it on
        # to the daemon, which drains and stops the embedded server, then the shell stops the HTTP handler.
        assert make.wait(timeout=60) in (0, -signal.SIGTERM)
        wait_for(lambda: "jobcar stopped" in (tmp_path / "make.log").read_text(), timeout=60,
                 what="the daemon to drain and stop")  # fmt: skip
        wait_for(lambda: not answers(f"http://127.0.0.1:{handler}/"), what="the HTTP handler to stop")
    finally:
        if make.poll() is None:
            make.kill()
            make.wait()
        log.close()
    output = (tmp_path / "make.log").read_text()
    assert "drained" in output, output
    assert not answers(f"http://127.0.0.1:{listen}/healthz"), "the daemon is gone"
    assert not answers(f"http://127.0.0.1:{handler}/"), "the HTTP handler is gone"
