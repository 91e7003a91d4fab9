"""The command executor and the guardian with real processes (guarantees 1, 10, 14 of docs/delivery-semantics.md).

"Gone" means no /proc entry or a zombie: a zombie has ended and only waits to be reaped by its
parent. Orphans are reparented to PID 1, and in some containers and sandboxes PID 1 never reaps, so
requiring the /proc entry itself to vanish would test the machine, not jobcar.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobcar.config_types import Backoff, CommandHandler
from jobcar.executors.command import CommandExecutor
from jobcar.executors.guardian import Guardian
from jobcar.job import Job
from jobcar.outcome import Outcome, OutcomeKind
from tests import factories
from tests.servers import wait_for

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# A handler that ignores SIGTERM and forks a child that ignores it too, then publishes both pids.
STUBBORN = f"""#!{sys.executable}
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = os.fork()
if child == 0:
    while True:
        time.sleep(1)
path = os.environ["PIDS_FILE"]
with open(path + ".tmp", "w") as f:
    f.write(f"{{os.getpid()}} {{child}}")
os.rename(path + ".tmp", path)
while True:
    time.sleep(1)
"""

# A shell handler that leaves a child in the background and waits for it.
FORKING = """#!/bin/sh
sleep 300 &
echo "$$ $!" > "$PIDS_FILE.tmp" && mv "$PIDS_FILE.tmp" "$PIDS_FILE"
wait
"""


def make_handler(command: list[str] | str, **overrides: Any) -> CommandHandler:
    fields: dict[str, Any] = {
        "type": "image.resize",
        "timeout": 30.0,
        "max_attempts": 5,
        "backoff": Backoff(),
        "max_retry_after": 3600.0,
        "command": (command,) if isinstance(command, str) else tuple(command),
    }
    fields.update(overrides)
    return CommandHandler(**fields)


def make_job(payload: bytes = b"", **overrides: Any) -> Job:
    return factories.make_job(payload, **{"id": "job-7", "type": "image.resize", **overrides})


#: Runs a test once on the default asyncio loop and once on uvloop (the daemon uses uvloop when present).
BOTH_LOOPS = pytest.mark.asyncio(loop_factories=["asyncio", "uvloop"])


async def execute(handler: CommandHandler, job: Job | None = None, *, guardian: Guardian | None = None) -> Outcome:
    executor = CommandExecutor(handler, guardian)
    return await executor.run(job or make_job(), deadline=time.time() + 60, max_attempts=5)


def script(tmp_path: Path, text: str, name: str = "handler") -> str:
    return factories.program(tmp_path, name, text)


def is_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return re.search(r"^State:\s+Z", status, re.MULTILINE) is not None


def live_group_members(pgid: int) -> list[int]:
    """Every process of group `pgid` that has not exited, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


async def eventually(condition: Callable[[], object], within: float = 10.0, what: str = "condition") -> None:
    """`wait_for` for async code: poll `condition` without blocking the loop; fail after `within` s."""
    try:
        async with asyncio.timeout(within):
            while True:
                if condition():
                    return
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {within}s waiting for {what}") from None


def read_pids(path: Path) -> list[int]:
    wait_for(path.exists, timeout=10, what=f"{path.name} written by the handler")
    return [int(pid) for pid in path.read_text().split()]


async def test_payload_reaches_stdin_byte_identical_and_nothing_else_runs(tmp_path: Path) -> None:
    marker = tmp_path / "X"
    payload = (
        f"; touch {marker}; $(touch {marker}) `touch {marker}` && touch {marker} | touch {marker}\n".encode()
        + b"\x00\xff\xfe\x80 $HOME ${PATH} 'quoted' \"double\" \\ \r\n\x00"
    )
    outcome = await execute(make_handler(["cat"]), make_job(payload))
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    assert outcome.result == payload
    assert not marker.exists(), "a payload must never be interpreted by a shell"


async def test_large_payload_to_a_handler_that_does_not_read_stdin() -> None:
    payload = os.urandom(8 * 1024 * 1024)
    assert (await execute(make_handler(["true"]), make_job(payload))).kind is OutcomeKind.SUCCESS
    echoed = await execute(
        make_handler([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"]), make_job(payload)
    )
    assert echoed.result == f"{len(payload)}\n".encode()


async def test_environment_holds_job_metadata_and_only_allow_listed_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBCAR_TEST_SECRET", "hunter2")
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("JOBCAR_TEST_ALLOWED", "passed on")
    monkeypatch.setenv("TZ", "Europe/Paris")
    dump = (
        f"#!{sys.executable}\nimport json, os\n"
        "print(json.dumps([dict(os.environ), os.getcwd(), os.getpgid(0), os.getsid(0), os.getpid()]))\n"
    )
    handler = make_handler(
        script(tmp_path, dump),
        env={"TMPDIR": "/var/tmp", "EXTRA": "1"},
        env_allow=("JOBCAR_TEST_ALLOWED",),
        cwd=str(tmp_path),
    )
    job = make_job(content_type="application/x-thing", traceparent=TRACEPARENT, schedule="nightly",
                   scheduled_at_ms=1_700_000_000_000, after=("default/extract", "low/7"))  # fmt: skip
    outcome = await execute(handler, job)
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    assert outcome.result is not None
    env, cwd, pgid, sid, pid = json.loads(outcome.result)
    assert env["JOBCAR_JOB_ID"] == "job-7"
    assert env["JOBCAR_JOB_TYPE"] == "image.resize"
    assert env["JOBCAR_QUEUE"] == "default"
    assert env["JOBCAR_ATTEMPT"] == "1"
    assert env["JOBCAR_MAX_ATTEMPTS"] == "5"
    assert env["JOBCAR_ENQUEUED_AT"] == "2023-11-14T22:13:20.123Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", env["JOBCAR_DEADLINE"])
    assert env["JOBCAR_CONTENT_TYPE"] == "application/x-thing"
    assert env["TRACEPARENT"] == TRACEPARENT
    assert (env["JOBCAR_SCHEDULE"], env["JOBCAR_SCHEDULED_AT"]) == ("nightly", "2023-11-14T22:13:20.000Z")
    assert env["JOBCAR_AFTER"] == "default/extract low/7"
    assert env["PATH"] == os.environ["PATH"]
    assert env["TZ"] == "Europe/Paris"
    assert env["JOBCAR_TEST_ALLOWED"] == "passed on"
    assert env["TMPDIR"] == "/var/tmp"
    assert env["EXTRA"] == "1"
    for leaked in ("JOBCAR_TEST_SECRET", "NOTIFY_SOCKET", "WATCHDOG_USEC"):
        assert leaked not in env, f"{leaked} must not reach a handler"
    assert "hunter2" not in outcome.result.decode()
    assert cwd == str(tmp_path)
    assert pgid == pid, "each job runs in its own session and process group"
    assert sid == pid, "each job runs in its own session and process group"


@BOTH_LOOPS
async def test_exit_0_is_success_with_stdout_as_result(tmp_path: Path) -> None:
    handler = make_handler(script(tmp_path, "#!/bin/sh\necho resized; echo 'a warning' >&2\n"))
    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 30, max_attempts=5)
    assert outcome.kind is OutcomeKind.SUCCESS, outcome
    assert outcome.result == b"resized\n"


async def test_permanent_exit_code_fails(tmp_path: Path) -> None:
    handler = make_handler(
        script(tmp_path, "#!/bin/sh\necho 'bad input: no width' >&2\nexit 65\n"),
        permanent_exit_codes=frozenset({64, 65}),
    )
    outcome = await execute(handler)
    assert outcome.kind is OutcomeKind.FAIL
    assert outcome.error == "exit code 65: bad input: no width"


async def test_other_exit_code_retries_with_the_stderr_tail(tmp_path: Path) -> None:
    text = (
        '#!/bin/sh\ni=0\nwhile [ $i -lt 5000 ]; do echo "noise line $i" >&2; i=$((i+1)); done\n'
        "echo 'the real cause' >&2\nexit 3\n"
    )
    outcome = await execute(
        make_handler(script(tmp_path, text), permanent_exit_codes=frozenset({65}), max_output_bytes=4096)
    )
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt
    assert outcome.error is not None
    assert outcome.error.startswith("exit code 3 (stderr truncated: "), outcome.error
    assert outcome.error.endswith("the real cause"), "the end of stderr says the most"
    assert len(outcome.error) <= 2000


async def test_stdout_is_the_error_detail_when_stderr_is_empty(tmp_path: Path) -> None:
    outcome = await execute(make_handler(script(tmp_path, "#!/bin/sh\necho 'printed to stdout'\nexit 1\n")))
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error == "exit code 1: stdout: printed to stdout"


async def test_death_by_signal_retries(tmp_path: Path) -> None:
    outcome = await execute(make_handler(script(tmp_path, "#!/bin/sh\necho dying >&2\nkill -KILL $$\n")))
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.error == "killed by signal SIGKILL: dying"


async def test_captured_stdout_is_capped_and_marked_truncated(tmp_path: Path) -> None:
    writer = f"#!{sys.executable}\nimport sys\nsys.stdout.write('0123456789' * 20000)\n"
    outcome = await execute(make_handler(script(tmp_path, writer), max_output_bytes=1000))
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result is not None
    assert outcome.result.startswith(b"0123456789" * 100)
    assert outcome.result[1000:] == b"\n[jobcar: stdout truncated: kept 1000 of 200000 bytes]"


@BOTH_LOOPS
async def test_timeout_kills_a_group_that_ignores_sigterm_within_grace(tmp_path: Path, pids_file: Path) -> None:
    timeout, grace = 1.0, 1.0
    handler = make_handler(
        script(tmp_path, STUBBORN), timeout=timeout, kill_grace=grace, env={"PIDS_FILE": str(pids_file)}
    )
    started = time.monotonic()
    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    leader, child = read_pids(pids_file)
    remaining = started + timeout + grace + 1.0 - time.monotonic()
    wait_for(lambda: is_gone(leader) and is_gone(child), timeout=max(remaining, 0.0), what="the group to be gone")
    assert live_group_members(leader) == []
    assert outcome.kind is OutcomeKind.RETRY
    assert outcome.spend_attempt
    assert outcome.error is not None
    assert outcome.error.startswith("timeout after 1.0s"), outcome.error
    assert "SIGKILL" in outcome.error


async def test_stragglers_are_killed_after_a_clean_exit(tmp_path: Path, pids_file: Path) -> None:
    text = '#!/bin/sh\nsleep 300 &\necho "$$ $!" > "$PIDS_FILE"\necho done\n'
    outcome = await execute(make_handler(script(tmp_path, text), env={"PIDS_FILE": str(pids_file)}))
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result == b"done\n"
    leader, child = read_pids(pids_file)
    wait_for(lambda: is_gone(child), timeout=2, what="the background child to be killed")
    assert live_group_members(leader) == []


async def test_a_group_that_exits_on_sigterm_is_not_killed_harder(tmp_path: Path) -> None:
    outcome = await execute(make_handler(["sleep", "300"], timeout=0.3, kill_grace=10.0))
    assert outcome.error == "timeout after 0.3s", "sleep exits on SIGTERM: no SIGKILL, no grace spent"


def read_rss_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def reset_peak_rss() -> bool:
    """Reset the peak-RSS watermark (VmHWM) so the peak from now on can be read; False where that is not
    possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@BOTH_LOOPS
async def test_an_output_flood_keeps_memory_bounded() -> None:
    gib = 1024**3
    command = ["sh", "-c", f"head -c {gib} /dev/zero & head -c {gib} /dev/zero >&2; wait"]
    handler = make_handler(command, max_output_bytes=64 * 1024, timeout=60.0)
    # Reset the peak-RSS watermark (VmHWM) so the peak during this job can be read afterwards; where
    # that fails, VmHWM is the lifetime peak, which earlier tests may have set.
    peak_measurable = reset_peak_rss()
    before = read_rss_kib("VmRSS")
    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    peak_growth_mib = (read_rss_kib("VmHWM") - before) / 1024
    growth_mib = (read_rss_kib("VmRSS") - before) / 1024
    assert growth_mib < 64, f"RSS grew {growth_mib:.1f} MiB"
    if peak_measurable:
        assert peak_growth_mib < 64, f"RSS peaked {peak_growth_mib:.1f} MiB above the start"
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result is not None
    assert outcome.result.startswith(b"\0" * 65536)
    assert outcome.result[65536:] == f"\n[jobcar: stdout truncated: kept 65536 of {gib} bytes]".encode()


@BOTH_LOOPS
async def test_cancelling_the_run_kills_the_group(tmp_path: Path, pids_file: Path) -> None:
    handler = make_handler(script(tmp_path, FORKING), kill_grace=5.0, env={"PIDS_FILE": str(pids_file)})

    task = asyncio.create_task(
        CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    )
    await eventually(pids_file.exists, what="the handler's pids file")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    leader, child = read_pids(pids_file)
    # The task only ends once the group is dead: nothing to wait for beyond signal delivery.
    wait_for(lambda: is_gone(leader) and is_gone(child), timeout=1, what="the group to be gone")
    assert live_group_members(leader) == []


async def test_a_second_cancel_does_not_cut_the_kill_short(tmp_path: Path, pids_file: Path) -> None:
    grace = 1.0
    handler = make_handler(script(tmp_path, STUBBORN), kill_grace=grace, env={"PIDS_FILE": str(pids_file)})
    ended: list[float] = []

    task = asyncio.create_task(
        CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
    )
    task.add_done_callback(lambda _: ended.append(time.monotonic()))
    await eventually(pids_file.exists, what="the handler's pids file")
    cancelled_at = time.monotonic()
    task.cancel()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended[0] - cancelled_at >= grace * 0.9, "the task ended before the group was killed"
    leader, child = read_pids(pids_file)
    wait_for(lambda: is_gone(leader) and is_gone(child), timeout=1, what="the group to be gone")


def live_with_marker(marker: str) -> list[int]:
    """Processes (not zombies) whose environment holds `marker`: every process a handler started."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes() and not is_gone(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@BOTH_LOOPS
async def test_a_cancel_while_spawning_still_kills_the_whole_group(tmp_path: Path) -> None:
    marker = f"JOBCAR_TEST_MARK_{uuid.uuid4().hex}"
    forking = script(tmp_path, FORKING)
    loop = asyncio.get_running_loop()
    try:
        for turns in range(8):
            handler = make_handler(forking, kill_grace=0.2, env={"PIDS_FILE": str(tmp_path / "pids"), marker: "1"})
            task = asyncio.create_task(
                CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 60, max_attempts=5)
            )
            for _ in range(turns):  # cancel at different points of the spawn
                await asyncio.sleep(0)
            # A stalled loop (a busy daemon) lets the handler fork before asyncio has finished spawning
            # it; cancelled then, asyncio alone kills only the leader and waits for the pipes forever.
            loop.call_soon(time.sleep, 0.05)
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await task
            await eventually(lambda: not live_with_marker(marker), within=1, what="the group to be gone")
    finally:
        for pid in live_with_marker(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_command_that_cannot_start_fails(tmp_path: Path) -> None:
    missing = await execute(make_handler(["/nonexistent/jobcar-handler", "--flag"]))
    assert missing.kind is OutcomeKind.FAIL
    assert missing.error is not None
    assert missing.error.startswith("cannot start command: ")
    not_executable = tmp_path / "handler.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    denied = await execute(make_handler([str(not_executable)]))
    assert denied.kind is OutcomeKind.FAIL
    assert denied.error is not None
    assert "Permission denied" in denied.error


PDEATHSIG = f"""#!{sys.executable}
import ctypes
value = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
print(value.value)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@BOTH_LOOPS
async def test_handlers_get_sigkill_as_parent_death_signal(tmp_path: Path) -> None:
    handler = make_handler(script(tmp_path, PDEATHSIG))
    outcome = await CommandExecutor(handler, None).run(make_job(), deadline=time.time() + 30, max_attempts=5)
    assert outcome.result == f"{int(signal.SIGKILL)}\n".encode()


DAEMON = """
import asyncio, sys, time
from pathlib import Path

from jobcar.config_types import Backoff, CommandHandler
from jobcar.executors.command import CommandExecutor
from jobcar.executors.guardian import Guardian
from jobcar.job import Job, State


async def main(handler_path: str, pids_file: str, guardian_file: str, use_guardian: bool) -> None:
    guardian = Guardian() if use_guardian else None
    if guardian is not None:
        await guardian.start()
        Path(guardian_file + ".tmp").write_text(str(guardian.pid))
        Path(guardian_file + ".tmp").rename(guardian_file)
    handler = CommandHandler(
        type="t", timeout=300, max_attempts=1, backoff=Backoff(), max_retry_after=1,
        command=(handler_path,), env={"PIDS_FILE": pids_file},
    )
    job = Job(id="j", queue="default", type="t", payload=b"", state=State.ACTIVE, attempt=1)
    await CommandExecutor(handler, guardian).run(job, deadline=time.time() + 300, max_attempts=1)


handler_path, pids_file, guardian_file, loop, use_guardian = sys.argv[1:]
coro = main(handler_path, pids_file, guardian_file, use_guardian == "yes")
if loop == "uvloop":
    import uvloop
    uvloop.run(coro)
else:
    asyncio.run(coro)
"""


@dataclass
class GuardedDaemon:
    """The test daemon (DAEMON) with its guardian, running one handler that published two pids."""

    process: subprocess.Popen[bytes]
    leader: int
    other: int
    guardian: int


@contextmanager
def a_guarded_daemon_running(
    tmp_path: Path, handler_source: str, pids_file: Path, loop: str
) -> Iterator[GuardedDaemon]:
    daemon_script = tmp_path / "daemon.py"
    daemon_script.write_text(DAEMON)
    guardian_file = tmp_path / "guardian"
    handler = script(tmp_path, handler_source)
    daemon = subprocess.Popen(
        [sys.executable, str(daemon_script), handler, str(pids_file), str(guardian_file), loop, "yes"]
    )
    try:
        leader, other = read_pids(pids_file)
        wait_for(guardian_file.exists, timeout=10, what="the guardian's pid")
        yield GuardedDaemon(daemon, leader, other, int(guardian_file.read_text()))
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_handlers_die_with_a_sigkilled_daemon(loop: str, tmp_path: Path, pids_file: Path) -> None:
    with a_guarded_daemon_running(tmp_path, FORKING, pids_file, loop) as daemon:
        leader, child = daemon.leader, daemon.other
        assert not is_gone(leader)
        assert not is_gone(child)
        assert not is_gone(daemon.guardian)
        daemon.process.kill()
        daemon.process.wait(timeout=10)
        wait_for(lambda: is_gone(leader) and is_gone(child), timeout=5, what="the handler and its child to die")
        assert live_group_members(leader) == []
        wait_for(lambda: is_gone(daemon.guardian), timeout=5, what="the guardian to exit")


def test_without_guardian_parent_death_signal_still_kills_the_direct_child(tmp_path: Path, pids_file: Path) -> None:
    daemon_script = tmp_path / "daemon.py"
    daemon_script.write_text(DAEMON)
    handler = script(tmp_path, FORKING)
    daemon = subprocess.Popen([sys.executable, str(daemon_script), handler, str(pids_file), "-", "asyncio", "no"])
    try:
        leader, _ = read_pids(pids_file)
        daemon.kill()
        daemon.wait(timeout=10)
        wait_for(lambda: is_gone(leader), timeout=5, what="the handler to die with its parent")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """`sleep 300` in a session and process group of its own; killed after the test if still running."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


async def test_closing_the_guardian_kills_groups_still_guarded(group: subprocess.Popen[bytes]) -> None:
    guardian = Guardian()
    await guardian.start()
    assert guardian.alive
    assert guardian.pid is not None
    # Signals that would stop a daemon must not stop its watchdog first.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(guardian.pid, signum)
    guardian.guard(group.pid)
    guardian.guard(4_000_000_000)  # nonsense ids are ignored
    await guardian.close()
    assert guardian.pid is None
    assert group.wait(timeout=5) == -signal.SIGKILL


async def test_a_released_group_is_left_alone(group: subprocess.Popen[bytes]) -> None:
    guardian = Guardian()
    await guardian.start()
    guardian.guard(group.pid)
    guardian.release(group.pid)
    await guardian.close()
    assert group.poll() is None, "the guardian killed a group it had been told to forget"


async def test_jobs_still_run_when_the_guardian_is_dead(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.ERROR, logger="jobcar.executors.guardian"):
        guardian = Guardian()
        await guardian.start()
        assert guardian.pid is not None
        os.kill(guardian.pid, signal.SIGKILL)
        await eventually(lambda: not guardian.alive, what="the guardian to be seen dead")
        outcome = await CommandExecutor(make_handler(["cat"]), guardian).run(
            make_job(b"still works"), deadline=time.time() + 30, max_attempts=5
        )
        await guardian.close()
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.result == b"still works"
    assert "guardian" in caplog.text
    assert "is gone" in caplog.text


async def test_guardian_that_cannot_start_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with caplog.at_level(logging.ERROR, logger="jobcar.executors.guardian"):
        guardian = Guardian()
        await guardian.start()
        guardian.guard(12345)
        guardian.release(12345)
        await guardian.close()
    assert not guardian.alive
    assert guardian.pid is None
    assert "cannot start the handler guardian" in caplog.text


@BOTH_LOOPS
async def test_handlers_that_exit_without_reading_stdin_succeed_under_load() -> None:
    """Seen with 100 concurrent jobs on uvloop: the stdin pipe was already closed when the payload was
    written, and the write raised instead of being dropped."""
    executor = CommandExecutor(make_handler([sys.executable, "-c", "pass"]), None)
    jobs = [make_job(payload=b"x" * 100_000) for _ in range(50)]
    outcomes = await asyncio.gather(*(executor.run(j, deadline=time.time() + 60, max_attempts=1) for j in jobs))
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCESS] * 50


def test_a_guardian_whose_daemon_died_before_it_was_ready_exits_without_a_word() -> None:
    """A daemon killed while starting closes the pipe the guardian says "ready" on: the guardian leaves
    quietly, since its stderr is the daemon's log stream (a traceback there is not a JSON line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the daemon is gone before the guardian writes
    try:
        done = subprocess.run(
            [sys.executable, "-m", "jobcar.executors.guardian"],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, b"")
