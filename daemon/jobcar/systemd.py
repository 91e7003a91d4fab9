"""systemd's notification protocol (sd_notify) without libsystemd (packaging/jobcar.service uses it).

Under `Type=notify` systemd puts the path of a datagram socket in `$NOTIFY_SOCKET` and reads
newline-separated `KEY=value` assignments from it: `READY=1` ends "activating" (the daemon reports it
once Redis is reachable, so units ordered after jobcar start only then), `STOPPING=1` marks the drain,
`RELOADING=1` … `READY=1` brackets a SIGHUP reload, `STATUS=` is the line `systemctl status` shows and
`WATCHDOG=1` is the keep-alive ping `WatchdogSec=` asks for.

The pings come from an asyncio task on purpose: if the event loop stalls (a blocking call, a runaway
callback), the pings stop, systemd kills the daemon with SIGABRT and `Restart=on-failure` starts a new
one. Leases of the stalled daemon's jobs expire and are reaped like after any crash.

Nothing is removed from `os.environ` here (libsystemd's `unset_environment`): the watchdog needs the
variables for the daemon's whole life, and the command executor passes only an allow-list of the
environment to handlers, which leaves out every name in `SYSTEMD_VARIABLES`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import Final

__all__ = ["SYSTEMD_VARIABLES", "Notifier"]

log = logging.getLogger(__name__)

#: What systemd puts in a service's environment for the service itself (notification socket, watchdog,
#: socket activation, invocation and journal identity). Handlers must never see these: a handler that
#: wrote to NOTIFY_SOCKET could mark the daemon ready or feed its watchdog (with `NotifyAccess=main`
#: systemd ignores it, but only because of that setting), and LISTEN_FDS/LISTEN_PID describe file
#: descriptors the handler does not have. None of them is in `config_types.DEFAULT_ENV_ALLOW`; a handler
#: gets one only if its `env_allow` names it.
SYSTEMD_VARIABLES: Final[tuple[str, ...]] = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
)

_USEC_PER_SECOND: Final = 1_000_000


class Notifier:
    """Sends state changes to systemd. Disabled (every method a no-op) outside `Type=notify`.

    `address` is `$NOTIFY_SOCKET` as systemd sets it: an absolute path, or `@name` for a socket in the
    abstract namespace. Sending never raises: a failure is logged at warning once, then at debug.
    """

    def __init__(
        self, address: str | None = None, *, watchdog_usec: int | None = None, watchdog_pid: int | None = None
    ) -> None:
        self._where = address
        self._address = _socket_address(address) if address else None
        self._watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._watchdog_pid = watchdog_pid
        self._warned = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        """The notifier systemd asks for through `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`."""
        address = environ.get("NOTIFY_SOCKET") or None
        usec = _positive_int(environ, "WATCHDOG_USEC")
        pid = _positive_int(environ, "WATCHDOG_PID")
        if "WATCHDOG_PID" in environ and pid is None:
            usec = None  # as libsystemd: a watchdog for an unknown process is not ours to feed
        return cls(address, watchdog_usec=usec, watchdog_pid=pid)

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify (the daemon runs under `Type=notify`)."""
        return self._address is not None

    def ready(self, status: str) -> None:
        """Start-up is complete: systemd moves the unit from "activating" to "active"."""
        self._send(f"READY=1\nSTATUS={_one_line(status)}")

    def status(self, text: str) -> None:
        """The one-line status `systemctl status jobcar` shows."""
        self._send(f"STATUS={_one_line(text)}")

    def stopping(self, status: str) -> None:
        """The drain has begun: the unit shows "deactivating" until the process exits."""
        self._send(f"STOPPING=1\nSTATUS={_one_line(status)}")

    def reloading(self) -> None:
        """A reload has begun; `reloaded()` ends it. systemd ≥ 253 (`Type=notify-reload`) requires
        MONOTONIC_USEC, in CLOCK_MONOTONIC like its own clock, to match RELOADING=1 to the reload it asked
        for; older versions ignore it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def reloaded(self, status: str) -> None:
        """The reload is done (or was refused and the running config kept): "active" again."""
        self._send(f"READY=1\nSTATUS={_one_line(status)}")

    def watchdog_interval(self) -> float | None:
        """Seconds between keep-alive pings: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3) advises.
        None when there is no watchdog to feed: no socket, no `WATCHDOG_USEC`, or `WATCHDOG_PID` names
        another process (the variables were inherited from a parent that systemd watches)."""
        if self._address is None or self._watchdog_usec is None:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid != os.getpid():
            return None
        return self._watchdog_usec / 2 / _USEC_PER_SECOND

    async def watchdog(self) -> None:
        """Send `WATCHDOG=1` every `watchdog_interval()` seconds until cancelled; return at once without a
        watchdog. Run it as a task on the daemon's event loop: a stalled loop must stop the pings."""
        interval = self.watchdog_interval()
        if interval is None:
            return
        while True:
            self._send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _send(self, message: str) -> None:
        if self._address is None:
            return
        try:
            # A fresh unconnected socket per message, as libsystemd does: nothing to go stale when
            # systemd re-executes itself, and a message every few seconds costs nothing.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block the event loop: if systemd's receive queue is full the message is dropped
                # (EAGAIN, logged below) and the next ping tries again.
                sock.setblocking(False)
                sock.sendto(message.encode(), self._address)
        except OSError as exc:
            first = message.partition("\n")[0]
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot notify systemd at %s of %s: %s (further failures logged at debug)", self._where, first, exc
                )
            else:
                log.debug("cannot notify systemd of %s: %s", first, exc)


def _socket_address(address: str) -> bytes | None:
    """`$NOTIFY_SOCKET` as a socket address; None (with a warning) for a form this module cannot use."""
    if address.startswith("@") and len(address) > 1:
        return b"\0" + os.fsencode(address[1:])  # Linux abstract namespace
    if address.startswith("/"):
        return os.fsencode(address)
    # systemd ≥ 254 may also pass "vsock:CID:PORT" (for virtual machines); not a case for a job runner.
    log.warning("NOTIFY_SOCKET=%r is neither an absolute path nor @abstract: systemd notifications are off", address)
    return None


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        log.warning("ignoring %s=%r: not a positive integer", name, raw)
        return None
    return value


def _one_line(text: str) -> str:
    # A newline would start a new assignment: a status could otherwise say READY=1 by accident.
    return " ".join(text.splitlines())
