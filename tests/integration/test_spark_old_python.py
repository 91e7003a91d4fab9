"""The producer part on an older Python, as a Spark executor would run it: the zip that `python -m jobcar.spark
zip` builds, imported by a real Python 3.10 interpreter (beside it only redis-py and what redis-py needs on
3.10), enqueues rows as the Spark writers do; a real Python 3.9 is refused with a clear error. An interpreter
that is not on the machine skips its test, saying so."""

from __future__ import annotations

import glob
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

ENQUEUE = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import jobcar.spark  # noqa: the backfills first, as on an executor
from jobcar.spark_rows import Connection, RowJobs, send

rows = [{"order_id": f"o-{n}", "n": n} for n in range(120)]
jobs = RowJobs(type="old.python", type_column=None, id_column="order_id", id_prefix=None, payload_column=None,
               options={"priority": 3, "expires_in": "1h", "batch": "old"}, columns={})
connection = Connection(sys.argv[3], sys.argv[4])
connection.check()
with connection.client() as client:
    first, again = send(client, jobs.specs(rows), 50), send(client, jobs.specs(rows), 50)
    status = client.batch_status("old")
print(json.dumps({"python": list(sys.version_info[:2]), "jobcar": sys.modules["jobcar"].__file__,
                  "first": first.created, "again": again.existed, "total": status.total}))
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
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the zip built by `python -m jobcar.spark zip`, a directory holding only redis-py)."""
    work = tmp_path_factory.mktemp("old-python")
    archive = cli_zip(work)
    deps = work / "deps"
    deps.mkdir()
    # redis-py is pure Python (3.10 and later); on 3.10 it imports async_timeout too, as pip installs it there.
    (deps / "redis").symlink_to(Path(redis.__file__).parent)
    (deps / "async_timeout").symlink_to(Path(async_timeout.__file__).parent)
    return archive, deps


def test_the_zip_enqueues_on_python_3_10(shipped: tuple[Path, Path], redis_server: RedisServer, namespace: str) -> None:
    python = _interpreter("3.10")
    if python is None:
        pytest.skip("no Python 3.10 on this machine (python3.10 on PATH or under pyenv)")
    archive, deps = shipped
    done = subprocess.run([python, "-I", "-c", ENQUEUE, str(archive), str(deps), redis_server.url, namespace],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"python": [3, 10], "jobcar": f"{archive}/jobcar/__init__.py", "first": 120, "again": 120,
                      "total": 120}  # fmt: skip
    with Client.from_url(redis_server.url, namespace=namespace) as client:
        job = client.get("o-7")
    assert job is not None
    assert (job.priority, job.batch, json.loads(job.payload)) == (3, "old", {"order_id": "o-7", "n": 7})


def test_python_3_9_is_refused_with_a_clear_error(shipped: tuple[Path, Path]) -> None:
    python = _interpreter("3.9")
    if python is None:
        pytest.skip("no Python 3.9 on this machine (python3.9 on PATH or under pyenv)")
    archive, deps = shipped
    done = subprocess.run([python, "-I", "-c", ENQUEUE, str(archive), str(deps), "redis://127.0.0.1:1", "x"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "jobcar's producer needs Python 3.10 or later on the Spark executors, this is 3.9" in done.stderr
