"""The producer part on an older Python, as a Spark executor would run it: the zip that `python -m jobcar.spark
zip` builds, imported by real Python 3.9 and 3.10 interpreters, beside only redis-py (3.9: the redis-py pip
picks for it, in .venv-py39; 3.10: .venv's) and what redis-py needs there, enqueues rows as the Spark writers
do and jobs with the client's options; a real Python 3.8 is refused with a clear error. The modules a run
loaded are then read for what 3.9 cannot evaluate. An interpreter that is not on the machine skips its test,
saying so."""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import async_timeout
import pytest
import redis

from jobcar import Client
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
#: Made by `make .venv-py39` (the Makefile says how it finds a 3.9).
PY39 = ROOT / ".venv-py39" / "bin" / "python"

# Rows as the Spark writers send them (with the values Spark hands over: dates, times, decimals, arrays), then
# the client's own calls with the options that take the most of the producer's code on their way.
ENQUEUE = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import jobcar.spark  # noqa: the backfills first, as on an executor
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from jobcar.spark_rows import Connection, RowJobs, send

rows = [{"order_id": f"o-{n}", "n": n, "day": date(2026, 3, 1), "at": datetime(2026, 3, 1, tzinfo=timezone.utc),
         "amount": Decimal("1.50"), "tags": ["a", "b"]} for n in range(120)]
jobs = RowJobs(type="old.python", type_column=None, id_column="order_id", id_prefix=None, payload_column=None,
               options={"priority": 3, "expires_in": "1h", "batch": "old"}, columns={})
connection = Connection(sys.argv[3], sys.argv[4])
connection.check()
with connection.client() as client:
    first, again = send(client, jobs.specs(rows), 50), send(client, jobs.specs(rows), 50)
    status = client.batch_status("old")
    chain = client.chain([("old.step", {"n": 1}), ("old.step", {"n": 2}, {"keep_for": "1h"})])
    after = client.enqueue("old.after", {"x": 1}, job_id="after-1", after=[chain[-1], "o-7"])
    later = client.enqueue("old.later", None, job_id="later-1", unique_for=timedelta(minutes=5),
                           run_at=datetime(2030, 1, 1, tzinfo=timezone.utc))
print(json.dumps({"python": list(sys.version_info[:2]), "jobcar": sys.modules["jobcar"].__file__,
                  "first": first.created, "again": again.existed, "total": status.total,
                  "chain": [info.status for info in chain], "after": after.status, "later": later.status,
                  "states": [client.get(i).state for i in ("after-1", "later-1")],
                  "modules": sorted(m for m in sys.modules if m.startswith("jobcar"))}))
"""


def _interpreter(version: str) -> str | None:
    """A Python X.Y that runs: pyenv's, else pythonX.Y on PATH (a pyenv shim of a version not selected fails)."""
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates = [
        *sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}")),
        shutil.which(f"python{version}"),
    ]
    for candidate in filter(None, candidates):  # type: ignore[var-annotated]
        if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=30).returncode == 0:
            return candidate
    return None


def cli_zip(work: Path) -> Path:
    """work/jobcar.zip, built by `python -m jobcar.spark zip` as docs/spark.md says to build it."""
    archive = work / "jobcar.zip"
    built = subprocess.run([sys.executable, "-m", "jobcar.spark", "zip", str(archive)], cwd=work,
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "jobcar for the executors" in built.stdout
    return archive


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cli_zip(tmp_path_factory.mktemp("old-python"))


def _python_and_deps(version: str, work: Path) -> tuple[str, Path]:
    """An interpreter of `version` and a directory of the redis-py it runs (skips where there is none)."""
    if version == "3.9":
        if not PY39.exists():
            pytest.skip(f"no {PY39}: `make .venv-py39` makes it where a Python 3.9 is on the machine")
        return str(PY39), next((ROOT / ".venv-py39" / "lib").glob("python3.9/site-packages"))
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (python{version} on PATH or under pyenv)")
    # .venv's redis-py is pure Python and runs on 3.10; there it imports async_timeout too, as pip installs it.
    deps = work / "deps"
    deps.mkdir()
    (deps / "redis").symlink_to(Path(redis.__file__).parent)
    (deps / "async_timeout").symlink_to(Path(async_timeout.__file__).parent)
    return python, deps


def _evaluated_unions(path: Path) -> list[str]:
    """Where a module evaluates `X | Y` between types at run time (3.9 cannot): in isinstance, issubclass or
    cast, or as a module-level alias. Annotations are never evaluated (from __future__ import annotations)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass", "cast"):
            typed = node.args[1] if getattr(node.func, "id", None) != "cast" else node.args[0]
            if isinstance(typed, ast.BinOp) and isinstance(typed.op, ast.BitOr):
                found.append(f"{path.name}:{node.lineno}")
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
            found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.parametrize("version", ["3.9", "3.10"])
def test_the_zip_enqueues_on_an_older_python(
    version: str, archive: Path, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    python, deps = _python_and_deps(version, tmp_path)
    done = subprocess.run([python, "-I", "-c", ENQUEUE, str(archive), str(deps), redis_server.url, namespace],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    modules = report.pop("modules")
    assert report == {"python": [int(n) for n in version.split(".")], "jobcar": f"{archive}/jobcar/__init__.py",
                      "first": 120, "again": 120, "total": 120, "chain": ["created", "created"],
                      "after": "created", "later": "created", "states": ["waiting", "scheduled"]}  # fmt: skip
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        job = client.get("o-7")
    assert job is not None
    assert (job.priority, job.batch) == (3, "old")
    assert json.loads(job.payload) == {"order_id": "o-7", "n": 7, "day": "2026-03-01",
                                       "at": "2026-03-01T00:00:00+00:00", "amount": "1.50",
                                       "tags": ["a", "b"]}  # fmt: skip
    # What the run loaded evaluates no union of types: a path this run did not take would fail there on 3.9.
    assert {"jobcar.client", "jobcar.spark_rows", "jobcar.dependencies"} <= set(modules)
    sources = [Path(str(importlib.util.find_spec(module).origin)) for module in modules]  # type: ignore[union-attr]
    assert [where for source in sources for where in _evaluated_unions(source)] == []


def test_python_3_8_is_refused_with_a_clear_error(archive: Path) -> None:
    python = _interpreter("3.8")
    if python is None:
        pytest.skip("no Python 3.8 on this machine (python3.8 on PATH or under pyenv)")
    done = subprocess.run([python, "-I", "-c", ENQUEUE, str(archive), str(archive), "redis://127.0.0.1:1", "x"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "jobcar's producer needs Python 3.9 or later on the Spark executors, this is 3.8" in done.stderr
