"""The README's and handlers/README.md's examples work as written.

Every fenced `sh`, `python` and `yaml` block of the two files is either run here — the shell and Python
ones against a real `jobcar run` of the quickstart config with its embedded server and example handlers,
the YAML ones through `jobcar check` — or named in NOT_RUN with the reason and the test that covers it
instead. A new block that is neither fails `test_every_example_is_run_or_accounted_for`: none is skipped
silently. The quickstart runs in a copy of the repository's config and handlers, on free ports.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers import free_port, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "handlers/README.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
JOBCAR = str(Path(sys.executable).parent / "jobcar")


@dataclass(frozen=True)
class Example:
    doc: str
    line: int
    lang: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Example(doc, line, match.group(1), match.group(2)))
    return found


def find(doc: str, first_line_start: str) -> Example:
    [example] = [e for e in examples() if e.doc == doc and e.text.startswith(first_line_start)]
    return example


#: Blocks not run here, by (document, the start of their first line): why, and what tests them instead.
NOT_RUN = {
    ("README.md", "make run"): "the two commands themselves: CI runs `make test`; `make run`'s parts run here",
    ("README.md", "from jobcar.spark_source import JobcarDataSource"): (
        "needs a Spark session and a server named redis: tests/integration/test_spark_source.py writes and reads "
        "with the format, and test_the_zip_command_builds_an_importable_package runs the zip command"
    ),
    ("README.md", 'curl -H "Authorization: Bearer $JOBCAR_ATTEMPT_TOKEN"'): (
        "runs inside a handler's attempt: tests/integration/test_handler_api_examples.py runs handlers/sh/*.sh, "
        "which make these calls with curl, under a real daemon"
    ),
    ("handlers/README.md", "handlers:\n  report.build"): (
        "the talking-back examples' config: tests/integration/test_handler_api_examples.py runs each of them "
        "under a daemon configured so"
    ),
    ("README.md", "jobcar stats"): (
        "a reference of commands with placeholders (ID, Q): test_every_command_of_the_cli_reference_exists"
    ),
    ("handlers/README.md", "PORT=8080"): "long-running servers: tests/integration/test_example_handlers.py runs both",
    ("README.md", "python3 -m pip wheel"): (
        "installs into /opt: tests/integration/test_wheel_install.py builds the wheel the same way and installs it "
        "into a fresh venv"
    ),
    ("README.md", "docker build"): (
        "needs a Docker engine and a registry: tests/unit/test_deploy.py checks the Dockerfile (hadolint, its "
        "contract, the build context)"
    ),
}
#: Blocks run by the tests below, by the same key.
RUN = {
    ("README.md", ".venv/bin/jobcar enqueue"),
    ("README.md", "from jobcar import Client\njobs = Client.from_config"),
    ("README.md", "jobcar enqueue email.welcome"),
    ("README.md", "from jobcar import Client\n\njobs = Client.from_config"),
    ("README.md", "redis:\n  url:"),
    ("README.md", "schedules:\n  nightly-report"),
    ("README.md", "handlers:\n  crm.sync"),
    ("handlers/README.md", "handlers:\n  image.resize"),
    ("handlers/README.md", "handlers:\n  text.count"),
}


def test_every_example_is_run_or_accounted_for() -> None:
    runnable = [e for e in examples() if e.lang in ("sh", "python", "yaml")]
    keys = {(doc, start) for doc, start in (*NOT_RUN, *RUN)}
    unaccounted = [e.name for e in runnable if not any(e.doc == d and e.text.startswith(s) for d, s in keys)]
    assert unaccounted == [], "run these examples here, or say in NOT_RUN why not"
    for doc, start in keys:
        find(doc, start)  # every key names exactly one block


@dataclass
class Quickstart:
    directory: Path
    env: dict[str, str]

    def sh(self, line: str) -> subprocess.CompletedProcess[str]:
        """One shell line of a README, its `jobcar` the one of this checkout, run with no shell."""
        argv = shlex.split(line, comments=True)
        if argv[0] in ("jobcar", ".venv/bin/jobcar"):
            argv[0] = JOBCAR
        return subprocess.run(argv, cwd=self.directory, env=self.env, capture_output=True, text=True, timeout=60)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], cwd=self.directory, env=self.env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quickstart]:
    """`make run`'s three parts from a copy of the repository's quickstart: the daemon with its embedded
    server, the shell handler, and the HTTP handler; ports swapped for free ones."""
    directory = tmp_path_factory.mktemp("quickstart")
    listen, handler_port = free_port(), free_port()
    config = (ROOT / "config" / "quickstart.yaml").read_text()
    config = config.replace("127.0.0.1:9321", f"127.0.0.1:{listen}").replace(
        "127.0.0.1:8089", f"127.0.0.1:{handler_port}"
    )
    (directory / "config").mkdir()
    (directory / "config" / "quickstart.yaml").write_text(config)
    (directory / "handlers" / "quickstart").mkdir(parents=True)
    for name in ("hello.sh", "hello_http.py"):
        (directory / "handlers" / "quickstart" / name).write_text((ROOT / "handlers" / "quickstart" / name).read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon"), "JOBCAR_CONFIG": "config/quickstart.yaml"}
    handler = subprocess.Popen(
        [sys.executable, "handlers/quickstart/hello_http.py", "--port", str(handler_port)], cwd=directory, env=env
    )
    log = (directory / "daemon.log").open("wb")
    daemon = subprocess.Popen([JOBCAR, "run", "-c", "config/quickstart.yaml"], cwd=directory, env=env, stdout=log,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: _ready(listen), timeout=60, what=f"the quickstart daemon ({directory / 'daemon.log'})")
        yield Quickstart(directory, env)
    finally:
        stop_process(daemon)
        stop_process(handler)
        log.close()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def test_the_quickstart_enqueue_commands(quickstart: Quickstart) -> None:
    for line in find("README.md", ".venv/bin/jobcar enqueue").text.splitlines():
        done = quickstart.sh(line)
        assert done.returncode == 0, (line, done.stderr)
        assert len(done.stdout.strip()) == 20, "the job's id"


def test_the_three_line_producer(quickstart: Quickstart) -> None:
    code = find("README.md", "from jobcar import Client\njobs = Client.from_config").text
    done = quickstart.python(code + "\nprint('enqueued')\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "enqueued"


def test_the_python_producer_example_waits_for_its_job(quickstart: Quickstart) -> None:
    code = find("README.md", "from jobcar import Client\n\njobs = Client.from_config").text
    done = quickstart.python(code + "\nprint(job.state.value, len(infos))\nprint(job.result.decode())\n")
    assert done.returncode == 0, done.stderr
    state, result = done.stdout.splitlines()
    assert state == "done 1000"
    assert json.loads(result) == {"hello": json.loads(result)["hello"]}, "the handler's answer, kept by result_ttl"


def test_the_cli_enqueue_examples(quickstart: Quickstart) -> None:
    (quickstart.directory / "payload.json").write_text('{"report": "monthly"}')
    for line in find("README.md", "jobcar enqueue email.welcome").text.splitlines():
        done = quickstart.sh(line)
        assert done.returncode == 0, (line, done.stderr)
        assert "has no handler for type" in done.stderr, "the quickstart has no such handler, and says so"


@pytest.mark.parametrize(
    ("doc", "start"),
    [("README.md", "redis:\n  url:"), ("README.md", "schedules:\n  nightly-report"),
     ("README.md", "handlers:\n  crm.sync"), ("handlers/README.md", "handlers:\n  image.resize"),
     ("handlers/README.md", "handlers:\n  text.count")],
)  # fmt: skip
def test_the_config_examples_pass_jobcar_check(doc: str, start: str, tmp_path: Path) -> None:
    path = tmp_path / "jobcar.yaml"
    path.write_text(find(doc, start).text)
    env = {**os.environ, "APP_TOKEN": "t", "JOBCAR_SIGNING_SECRET": "s", "PYTHONPATH": str(ROOT / "daemon")}
    done = subprocess.run([JOBCAR, "check", "-c", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_command_of_the_cli_reference_exists() -> None:
    for line in find("README.md", "jobcar stats").text.splitlines():
        words = shlex.split(line, comments=True)[1:]
        command = [w for w in words[:2] if re.fullmatch(r"[a-z]+", w)]
        if len(command) == 2 and command[0] not in ("jobs", "dead", "queue"):
            command = command[:1]
        done = subprocess.run([JOBCAR, *command, "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (line, done.stderr)


def test_the_zip_command_builds_an_importable_package(tmp_path: Path) -> None:
    assert "`python -m jobcar.spark zip jobcar.zip`" in (ROOT / "README.md").read_text()
    archive = tmp_path / "jobcar.zip"
    subprocess.run([sys.executable, "-m", "jobcar.spark", "zip", str(archive)], check=True, capture_output=True)
    probe = "import jobcar, sys; assert jobcar.__file__.startswith(sys.argv[1]), jobcar.__file__; print('ok')"
    done = subprocess.run([sys.executable, "-c", probe, str(archive)], env={**os.environ, "PYTHONPATH": str(archive)},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
