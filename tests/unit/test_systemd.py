"""`jobcar.systemd.Notifier` against a real datagram socket standing in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobcar.systemd import SYSTEMD_VARIABLES, Notifier

#: sun_path holds 108 bytes; pytest's tmp_path for a long test name can exceed it.
_MAX_SOCKET_PATH = 100


class FakeSystemd:
    """The receiving end of NOTIFY_SOCKET, as systemd binds it: AF_UNIX, SOCK_DGRAM."""

    def __init__(self, address: str) -> None:
        self.address = address  # as it goes into NOTIFY_SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(5)

    def receive(self) -> bytes:
        try:
            return self.sock.recv(4096)
        except TimeoutError:
            raise AssertionError(f"no notification reached {self.address} within 5 s") from None

    def pending(self) -> list[bytes]:
        """Every message queued right now, without waiting."""
        messages = []
        timeout = self.sock.gettimeout()
        self.sock.setblocking(False)
        try:
            while True:
                messages.append(self.sock.recv(4096))
        except BlockingIOError:
            return messages
        finally:
            self.sock.settimeout(timeout)

    def notifier(self, **environ: str) -> Notifier:
        return Notifier.from_environ({"NOTIFY_SOCKET": self.address, **environ})


@pytest.fixture
def short_tmp(tmp_path: Path) -> Iterator[Path]:
    if len(str(tmp_path / "notify")) <= _MAX_SOCKET_PATH:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="jobcar-") as short:
        yield Path(short)


@pytest.fixture
def systemd(short_tmp: Path) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(str(short_tmp / "notify"))
    yield fake
    fake.sock.close()


def test_ready_status_stopping_and_reloaded_send_exact_bytes(systemd: FakeSystemd) -> None:
    notifier = systemd.notifier()
    assert notifier.enabled
    notifier.ready("running: 3 handlers, queues critical, default")
    assert systemd.receive() == b"READY=1\nSTATUS=running: 3 handlers, queues critical, default"
    notifier.status("12 jobs running")
    assert systemd.receive() == b"STATUS=12 jobs running"
    notifier.reloaded("reloaded: 4 handlers")
    assert systemd.receive() == b"READY=1\nSTATUS=reloaded: 4 handlers"
    notifier.stopping("draining 2 jobs for up to 30 s")
    assert systemd.receive() == b"STOPPING=1\nSTATUS=draining 2 jobs for up to 30 s"
    assert systemd.pending() == []


def test_reloading_carries_the_monotonic_clock_in_microseconds(systemd: FakeSystemd) -> None:
    notifier = systemd.notifier()
    before = time.monotonic_ns() // 1000
    notifier.reloading()
    after = time.monotonic_ns() // 1000
    head, _, stamp = systemd.receive().partition(b"\nMONOTONIC_USEC=")
    assert head == b"RELOADING=1"
    assert stamp.isdigit(), stamp
    assert before <= int(stamp) <= after


def test_a_newline_in_a_status_cannot_add_an_assignment(systemd: FakeSystemd) -> None:
    systemd.notifier().status("handler said\nREADY=1")
    assert systemd.receive() == b"STATUS=handler said READY=1"


def test_abstract_namespace_socket(short_tmp: Path) -> None:
    fake = FakeSystemd(f"@jobcar-test/{uuid.uuid4().hex}/notify")
    try:
        fake.notifier().ready("up")
        assert fake.receive() == b"READY=1\nSTATUS=up"
    finally:
        fake.sock.close()
    assert not list(short_tmp.iterdir()), "an abstract socket has no file"


async def test_disabled_without_notify_socket() -> None:
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "30000000"})
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None
    notifier.ready("up")
    notifier.status("x")
    notifier.stopping("x")
    notifier.reloading()
    notifier.reloaded("x")

    async with asyncio.timeout(5):
        await notifier.watchdog()  # returns at once


@pytest.mark.parametrize("address", ["", "run/notify", "vsock:2:1234", "@"])
def test_unusable_notify_socket_disables_notifications(address: str) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "30000000"})
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None


def test_from_environ_reads_the_process_environment_by_default(
    systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", systemd.address)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = Notifier.from_environ()
    assert notifier.enabled
    assert notifier.watchdog_interval() == 1.0
    notifier.status("x")
    assert systemd.receive() == b"STATUS=x"
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC"):
        assert name in os.environ, "the notifier must not strip the daemon's environment"


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("100000", None, 0.05),
        ("30000000", "other", None),
        ("30000000", "not-a-pid", None),
        (None, None, None),
        (None, "self", None),
        ("0", None, None),
        ("-1", None, None),
        ("30s", None, None),
    ],
)
def test_watchdog_interval(systemd: FakeSystemd, usec: str | None, pid: str | None, expected: float | None) -> None:
    environ = {}
    if usec is not None:
        environ["WATCHDOG_USEC"] = usec
    if pid is not None:
        # An inherited WATCHDOG_PID names the process systemd watches: here this one, or its parent.
        environ["WATCHDOG_PID"] = {"self": str(os.getpid()), "other": str(os.getppid())}.get(pid, pid)
    assert systemd.notifier(**environ).watchdog_interval() == expected


def test_watchdog_needs_the_notify_socket_too() -> None:
    notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())})
    assert notifier.watchdog_interval() is None


def stall_the_event_loop(seconds: float) -> None:
    """What a blocking call in the daemon does, on purpose."""
    time.sleep(seconds)


async def test_watchdog_pings_from_the_event_loop_until_cancelled(systemd: FakeSystemd) -> None:
    notifier = systemd.notifier(WATCHDOG_USEC="100000", WATCHDOG_PID=str(os.getpid()))
    assert notifier.watchdog_interval() == 0.05
    systemd.sock.setblocking(False)

    loop = asyncio.get_running_loop()
    task = asyncio.create_task(notifier.watchdog())
    async with asyncio.timeout(10):
        pings = [await loop.sock_recv(systemd.sock, 4096) for _ in range(2)]
    assert pings == [b"WATCHDOG=1", b"WATCHDOG=1"]
    # A stalled loop must starve the pings: that is what lets systemd notice it. Blocked for ten
    # intervals, the watchdog sends nothing (a thread would have sent about ten); only a ping or
    # two sent before the stall began can be waiting.
    stall_the_event_loop(0.5)
    assert len(systemd.pending()) <= 2
    async with asyncio.timeout(10):
        assert await loop.sock_recv(systemd.sock, 4096) == b"WATCHDOG=1", "pings resume with the loop"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watchdog_returns_at_once_when_the_watchdog_is_for_another_process(systemd: FakeSystemd) -> None:
    notifier = systemd.notifier(WATCHDOG_USEC="100000", WATCHDOG_PID=str(os.getppid()))

    async with asyncio.timeout(5):
        await notifier.watchdog()
    assert systemd.pending() == []


def test_a_missing_socket_never_raises_and_warns_once(short_tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(short_tmp / "gone"), "WATCHDOG_USEC": "100000"})
    assert notifier.enabled
    with caplog.at_level(logging.DEBUG, logger="jobcar.systemd"):
        notifier.ready("up")
        notifier.status("x")
        notifier.reloading()
        notifier.reloaded("x")
        notifier.stopping("x")
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "gone" in warnings[0].getMessage()
    assert "READY=1" in warnings[0].getMessage()
    assert len(caplog.records) == 5, "later failures are still logged, at debug"


def test_a_full_receive_queue_drops_messages_instead_of_blocking(
    systemd: FakeSystemd, caplog: pytest.LogCaptureFixture
) -> None:
    """systemd busy (its queue full, net.unix.max_dgram_qlen is 10 by default) must not stall the event loop."""
    notifier = systemd.notifier()
    sent = threading.Event()

    def flood() -> None:
        for n in range(200):
            notifier.status(f"{n}")
        sent.set()

    with caplog.at_level(logging.WARNING, logger="jobcar.systemd"):
        threading.Thread(target=flood, daemon=True).start()
        assert sent.wait(10), "sending blocked on a full socket queue"
    assert len(caplog.records) == 1, caplog.text
    received = systemd.pending()
    assert received
    assert len(received) < 200
    assert received[0] == b"STATUS=0"


def test_systemd_variables_are_exported_for_documentation() -> None:
    assert {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "INVOCATION_ID"} <= set(SYSTEMD_VARIABLES)
    assert len(set(SYSTEMD_VARIABLES)) == len(SYSTEMD_VARIABLES) == 8
