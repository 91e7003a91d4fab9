"""jobcar under systemd: `packaging/jobcar.service` as systemd itself reads it, the settings the daemon's
lifecycle depends on, and the environment systemd gives the daemon staying away from its handlers.

`systemd-analyze verify` is systemd's own unit loader run offline: it needs no running systemd (CI
containers have none) and reports unknown keys, bad values and missing executables. It checks that
ExecStart=/ExecStartPre=/ExecReload= executables exist, and /usr/local/bin/jobcar exists only once the
package is installed there, so the test verifies a copy of the unit in a temporary directory with that
path rewritten to the `jobcar` script of the environment running the tests. Nothing else changes: a
warning about the copy is a warning about the unit. (`--root=DIR` would make systemd-analyze resolve
executables under DIR, but then the unit and every unit it depends on would have to be laid out there.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from jobcar.config_types import CommandHandler, Config
from jobcar.executors.command import CommandExecutor
from jobcar.systemd import SYSTEMD_VARIABLES
from tests.integration.test_command_executor import make_handler, make_job, script

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "jobcar.service"
INSTALLED_JOBCAR = "/usr/local/bin/jobcar"
CONFIG = "/etc/jobcar/jobcar.yaml"
INSTALL_HINT = (
    "systemd-analyze is not installed, and this test needs it to check packaging/jobcar.service. "
    "On Debian/Ubuntu: `apt-get update && apt-get install -y systemd` (.ci/run does this; it only installs "
    "files, it does not start systemd); on Fedora: `dnf install systemd`."
)
#: Seconds the daemon needs after the drain's two deadlines: giving jobs back, closing connections.
STOP_MARGIN = 5.0


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


def venv_jobcar() -> str:
    """The `jobcar` entry point installed beside the interpreter running the tests (.venv/bin/jobcar)."""
    path = Path(sys.executable).parent / "jobcar"
    assert os.access(path, os.X_OK), f"{path} is missing: install the package (`pip install -e .`)"
    return str(path)


def verify(text: str, directory: Path) -> list[str]:
    """Every line `systemd-analyze verify` prints about the unit `text` (saved as jobcar.service in
    `directory`), plus its exit status when that is not 0. Lines about *other* units it loaded on the
    way (multi-user.target, network-online.target and their dependencies, whatever this machine has
    installed) are left out: they are this machine's problems, not the unit's."""
    unit = directory / "jobcar.service"
    unit.write_text(text)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "SYSTEMD_LOG_TARGET": "console",  # on stderr, never only in the journal
        "SYSTEMD_LOG_COLOR": "0",
        "SYSTEMD_PAGER": "",
    }
    process = subprocess.run(
        [systemd_analyze(), "verify", str(unit)],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    lines = [line for line in (process.stdout + process.stderr).splitlines() if line.strip()]
    about_unit = [line for line in lines if not _about_another_unit(line, unit)]
    if process.returncode != 0:
        about_unit.append(f"(systemd-analyze verify exited {process.returncode}; all it printed: {lines})")
    return about_unit


_UNIT_SUFFIXES = r"service|socket|target|mount|automount|swap|path|timer|slice|scope|device"
_UNIT_FILE_LINE = re.compile(rf"^(?P<path>/\S+\.(?:{_UNIT_SUFFIXES}|conf)):\d+: ")
_UNIT_NAME_LINE = re.compile(rf"^(?P<name>[\w:@.\\-]+\.(?:{_UNIT_SUFFIXES})): ")


def _about_another_unit(line: str, unit: Path) -> bool:
    if match := _UNIT_FILE_LINE.match(line):
        return Path(match["path"]) != unit
    if match := _UNIT_NAME_LINE.match(line):
        return match["name"] != unit.name
    return False  # not attributable to another unit: count it


def unit_text() -> str:
    text = UNIT.read_text()
    assert INSTALLED_JOBCAR in text
    return text


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """section → key → values in order (a key may repeat, e.g. ExecReload=). Comments and blank lines
    dropped; no continuation lines (the unit uses none)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {number}: continuation lines are not expected"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"line {number}: {line!r} before any [section]"
        key, equals, value = line.partition("=")
        assert equals, f"line {number}: {line!r} is not KEY=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    """A systemd time span ("45", "45s", "1min 30s", "2min") in seconds."""
    units = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    assert parts, f"cannot read {value!r}"
    assert "".join(n + u for n, u in parts) == value.replace(" ", ""), f"cannot read {value!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


@pytest.fixture(scope="module")
def service() -> dict[str, list[str]]:
    return parse_unit(unit_text())["Service"]


def one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values is not None, f"{key}= is missing from [Service]"
    assert len(values) == 1, f"{key}= is set {len(values)} times: {values}"
    return values[0]


# -- systemd-analyze verify --------------------------------------------------------------------------


def test_systemd_analyze_verify_finds_nothing_to_say(tmp_path: Path) -> None:
    problems = verify(unit_text().replace(INSTALLED_JOBCAR, venv_jobcar()), tmp_path)
    assert problems == [], "systemd-analyze verify complained about packaging/jobcar.service:\n" + "\n".join(problems)


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above means something: a typo, a bad value and a missing executable are all reported."""
    broken = (
        unit_text()
        .replace("KillMode=mixed", "KillMod=mixed")
        .replace("RestartSec=2", "RestartSec=soon")
        .replace(INSTALLED_JOBCAR, str(tmp_path / "no-such-jobcar"))
    )
    problems = "\n".join(verify(broken, tmp_path))
    assert "KillMod" in problems, problems
    assert "soon" in problems, problems
    assert "no-such-jobcar" in problems, problems


def test_the_units_commands_are_valid_jobcar_command_lines(tmp_path: Path, service: dict[str, list[str]]) -> None:
    """ExecStartPre= and ExecReload= run `jobcar check -c CONFIG`: that command line must be one the CLI
    accepts and exits 0 for on a valid file."""
    config = tmp_path / "jobcar.yaml"
    config.write_text("redis:\n  url: redis://127.0.0.1:6379/0\nhandlers:\n  noop:\n    command: [/bin/true]\n")
    for command in (one(service, "ExecStartPre"), service["ExecReload"][0]):
        argv = command.replace(INSTALLED_JOBCAR, venv_jobcar()).replace(CONFIG, str(config)).split()
        process = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert process.returncode == 0, f"{argv}: exit {process.returncode}\n{process.stdout}{process.stderr}"


# -- what the daemon's lifecycle depends on -------------------------------------------------------


def test_notify_type_and_commands(service: dict[str, list[str]]) -> None:
    assert one(service, "Type") == "notify"
    assert one(service, "NotifyAccess") == "main"
    assert one(service, "ExecStart") == f"{INSTALLED_JOBCAR} run -c {CONFIG}"
    assert one(service, "ExecStartPre") == f"{INSTALLED_JOBCAR} check -c {CONFIG}"
    reload = service["ExecReload"]
    assert reload[-1] == "/bin/kill -HUP $MAINPID", f"the last ExecReload= must send SIGHUP to the daemon: {reload}"
    assert all(command.startswith(INSTALLED_JOBCAR) for command in reload[:-1]), (
        "anything run before the SIGHUP only checks"
    )


def test_stop_lets_jobcar_drain(service: dict[str, list[str]]) -> None:
    assert one(service, "KillMode") == "mixed", "systemd must signal the daemon only; jobcar stops its handlers"
    shutdown_timeout = Config(source="defaults").shutdown_timeout
    kill_grace = next(f.default for f in fields(CommandHandler) if f.name == "kill_grace")
    assert isinstance(kill_grace, float)
    stop = seconds(one(service, "TimeoutStopSec"))
    assert stop > shutdown_timeout + kill_grace + STOP_MARGIN, (
        f"TimeoutStopSec={stop:g}s leaves no room for a drain: shutdown_timeout {shutdown_timeout:g}s "
        f"+ kill_grace {kill_grace:g}s + {STOP_MARGIN:g}s to give jobs back"
    )
    assert "KillSignal" not in service, "the daemon drains on SIGTERM (the default KillSignal)"
    assert service.get("SendSIGKILL", ["yes"]) == ["yes"], "a daemon stuck past TimeoutStopSec must still die"


def test_watchdog_and_restart(service: dict[str, list[str]]) -> None:
    watchdog = seconds(one(service, "WatchdogSec"))
    assert 10 <= watchdog <= 120, f"WatchdogSec={watchdog:g}s: pings go every {watchdog / 2:g}s"
    assert one(service, "Restart") == "on-failure"
    assert seconds(one(service, "RestartSec")) > 0


def test_user_directories_and_environment(service: dict[str, list[str]]) -> None:
    assert one(service, "User") == "jobcar"
    assert one(service, "Group") == "jobcar"
    assert one(service, "StateDirectory") == "jobcar"
    assert one(service, "WorkingDirectory") == "/var/lib/jobcar"
    assert one(service, "EnvironmentFile") == "-/etc/jobcar/env"
    assert "PYTHONUNBUFFERED=1" in service["Environment"], "logs must reach the journal as they are written"
    assert "PYTHONFAULTHANDLER=1" in service["Environment"], "a watchdog SIGABRT must log where the loop was stuck"
    assert parse_unit(unit_text())["Install"] == {"WantedBy": ["multi-user.target"]}


HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "UMask": "0077",
}


@pytest.mark.parametrize(("key", "value"), HARDENING.items())
def test_hardening(service: dict[str, list[str]], key: str, value: str) -> None:
    assert one(service, key) == value


def test_no_hardening_that_breaks_jit_handlers(service: dict[str, list[str]]) -> None:
    assert "MemoryDenyWriteExecute" not in service, "handlers may be JIT runtimes (Node.js, the JVM, PyPy)"


# -- systemd's environment stays with the daemon ----------------------------------------------------


async def test_a_command_handler_sees_none_of_systemds_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under systemd the daemon's environment holds NOTIFY_SOCKET, WATCHDOG_USEC and the rest; the
    notifier leaves them there (the watchdog needs them), and the command executor's allow-list keeps
    them from a real handler process."""
    systemd_env = {name: f"{name.lower()}-value" for name in SYSTEMD_VARIABLES}
    systemd_env |= {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000", "LISTEN_FDS": "1"}
    systemd_env |= {"WATCHDOG_PID": str(os.getpid()), "LISTEN_PID": str(os.getpid())}
    for name, value in systemd_env.items():
        monkeypatch.setenv(name, value)
    dump = f"#!{sys.executable}\nimport json, os\nprint(json.dumps(dict(os.environ)))\n"
    handler = make_handler(script(tmp_path, dump))

    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    result = outcome.result
    assert result is not None
    env = json.loads(result)
    assert env["JOBCAR_JOB_ID"] == "job-7", "the handler ran and reported its environment"
    leaked = sorted(name for name in SYSTEMD_VARIABLES if name in env)
    assert leaked == [], f"systemd's variables reached a handler: {leaked}"
    for name, value in systemd_env.items():
        assert os.environ[name] == value, "the daemon keeps its own environment"
