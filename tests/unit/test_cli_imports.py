"""The CLI imports what the command given needs, and no other command's modules: operators call it in
loops, and `jobcar --version` spent most of a second importing aiohttp and the dashboard.

What a real `jobcar` process imported is read from the lines `import 'NAME'` that Python's verbose mode
(PYTHONVERBOSE) writes to stderr for every module it loads, however it was imported (`-X importtime`
misses a module loaded by importlib.import_module, as the command table does).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import jobcar
from jobcar.cli import COMMANDS, main
from tests.integration.test_cli import cli, write_config
from tests.servers import RedisServer

#: What only the daemon, the dashboard (`ui`) or the HTTP API need.
SERVING: frozenset[str] = frozenset(
    {"aiohttp", "jinja2", "prometheus_client", "uvloop", "jobcar.api", "jobcar.daemon", "jobcar.ui", "jobcar.runner",
     "jobcar.metrics", "jobcar.executors.http", "jobcar.cli_ui"}
)  # fmt: skip
#: What a command that talks to Redis, or reads the config, needs; the other commands' modules.
WORKING: frozenset[str] = frozenset(
    {"asyncio", "redis", "yaml", "jobcar.client", "jobcar.config", "jobcar.admin", "jobcar.embedded",
     "jobcar.cli_ops", "jobcar.cli_schedules", "jobcar.cli_health"}
)  # fmt: skip


LOADED: re.Pattern[str] = re.compile(r"^import '([\w.]+)' ", re.MULTILINE)


def imported(*args: str) -> tuple[set[str], str]:
    """The modules `jobcar ARGS...` imported, and its stdout; it must exit 0."""
    done = cli(*args, env={"PYTHONVERBOSE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return set(LOADED.findall(done.stderr)), done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--version"], f"jobcar {jobcar.__version__}\n"),
        (["--help"], "usage: jobcar "),
        (["enqueue", "--help"], "usage: jobcar enqueue "),
    ],
    ids=" ".join,
)
def test_version_and_help_import_no_command(args: list[str], says: str) -> None:
    modules, out = imported(*args)
    assert out.startswith(says)
    assert sorted(modules & (SERVING | WORKING)) == []


def test_stats_imports_redis_and_the_config_but_nothing_that_serves(redis_server: RedisServer, tmp_path: Path) -> None:
    config = write_config(tmp_path / "jobcar.yaml", f"redis: {{url: '{redis_server.url}'}}\nqueues: {{q: 1}}\n")
    modules, out = imported("stats", "-c", str(config))
    assert out.startswith("QUEUE")
    assert {"redis", "yaml", "jobcar.config", "jobcar.admin", "jobcar.cli_ops"} <= modules
    unneeded = {"jobcar.client", "jobcar.embedded", "jobcar.cli_schedules", "jobcar.cli_health"}
    assert sorted(modules & (SERVING | unneeded)) == []


#: Every command, and every action of a group, as typed.
COMMAND_LINES: tuple[str, ...] = (
    "run", "check", "enqueue", "stats", "limits", "jobs list", "jobs show", "jobs logs", "jobs cancel",
    "dead requeue", "dead purge", "queue pause", "queue resume", "schedules list", "schedules show", "schedules set",
    "schedules pause", "schedules resume", "schedules trigger", "schedules remove", "cancel", "fsck", "migrate",
    "health", "ui",
)  # fmt: skip


def test_the_command_lines_name_every_command() -> None:
    named = list(dict.fromkeys(line.split()[0] for line in COMMAND_LINES))
    assert [c.name for c in COMMANDS] == named, "add a new command, and each of its actions, to COMMAND_LINES"


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_every_command_adds_its_arguments_when_parsed(line: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A command names its functions by module and name, resolved only when it is parsed: each resolves."""
    assert main([*line.split(), "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: jobcar {line} ")
