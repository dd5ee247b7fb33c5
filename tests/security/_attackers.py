"""The on-path attacker of the security tests: a TCP relay that records, flips and injects."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

# Rewrites bytes flowing from the dialer to the listener: (offset of the chunk, chunk) -> chunk.
Tamper = Callable[[int, bytes], bytes]


class OnPathProxy:
    """Relays one TCP port to another, recording (and optionally rewriting) the traffic."""

    def __init__(
        self, target: tuple[str, int], tamper: Tamper | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.target = target
        self.tamper = tamper
        self.upstream = bytearray()  # what the dialer sent
        self.downstream = bytearray()  # what the listener sent
        self.host = host
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        offset = 0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            with self._lock:
                (self.upstream if up else self.downstream).extend(data)
            if up and self.tamper is not None:
                data = self.tamper(offset, data)
            offset += len(data)
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()
