"""The test servers themselves: a port taken between choosing it and binding it does not fail a test. The port
is taken as a client's outgoing connection takes one: bound, not listening."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.servers import PortTaken, RedisServer, free_port


def test_a_first_start_whose_port_was_taken_moves_to_another(server_binary: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        server = RedisServer(server_binary, tmp_path / "moved", port=port).start()
        try:
            assert server.port != port
            with server.client() as client:
                assert client.ping()
        finally:
            server.stop()


def test_a_restart_keeps_its_port_and_says_it_was_taken(server_binary: str, tmp_path: Path) -> None:
    server = RedisServer(server_binary, tmp_path / "kept", port=free_port()).start()
    port = server.port
    server.stop()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        with pytest.raises(PortTaken, match="Address already in use"):
            server.start()
        assert server.port == port
