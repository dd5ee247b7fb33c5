"""The controller's debugger server: authenticated ``regency debug`` clients on a TCP port.

It listens on loopback unless ``REGENCY_DEBUG_SERVER_HOST`` names another address, on
``REGENCY_DEBUG_SERVER_PORT`` or a free port, from a thread of its own. A connection must finish
the handshake of :mod:`regency.observe.debug_wire` within :data:`HANDSHAKE_TIMEOUT` seconds;
at most :data:`MAX_HANDSHAKES` may be in it at once, and a peer that failed too often is refused
for a while (:class:`regency._transport.ratelimit.FailureLimiter`). One client is served at a
time: two clients typing into the same ``pdb`` would confuse both, so a second one is told who
is attached and closed.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable

from regency._transport.ratelimit import FailureLimiter, peer_key
from regency.observe.debug_repl import DebugRepl
from regency.observe.debug_sessions import Sessions
from regency.observe.debug_wire import LineChannel, WireError, proof

log = logging.getLogger("regency.debugger")

HOST_ENV = "REGENCY_DEBUG_SERVER_HOST"
PORT_ENV = "REGENCY_DEBUG_SERVER_PORT"
HANDSHAKE_TIMEOUT = 5.0
MAX_HANDSHAKES = 16


def server_address() -> tuple[str, int]:
    """Where the server listens: ``REGENCY_DEBUG_SERVER_HOST``/``_PORT``.

    By default loopback and a free port; ``ValueError`` names a bad port.
    """
    host = os.environ.get(HOST_ENV, "").strip() or "127.0.0.1"
    port_text = os.environ.get(PORT_ENV, "").strip() or "0"
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{PORT_ENV}={port_text!r} is not a TCP port number")
    return host, int(port_text)


class _Client:
    """The REPL's view of one authenticated client connection."""

    def __init__(self, channel: LineChannel) -> None:
        self._channel = channel

    def out(self, text: str) -> None:
        if text:
            with contextlib.suppress(OSError):
                self._channel.send(out=text)

    def read(self, prompt: str) -> str | None:
        try:
            self._channel.send(read=prompt)
            message = self._channel.receive()
        except (OSError, WireError):
            return None
        line = message.get("line")
        return line if isinstance(line, str) else None


class DebugServer:
    """Serves ``regency debug`` clients over the sessions of this controller."""

    def __init__(
        self,
        sessions: Sessions,
        tokens: Callable[[], list[str]],
        address: tuple[str, int] | None = None,
    ) -> None:
        host, port = address if address is not None else server_address()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(16)
        self._sessions = sessions
        self._tokens = tokens
        self._limiter = FailureLimiter()
        self._lock = threading.Lock()
        self._handshaking = 0
        self._attached: str | None = None
        self._closed = False
        bound = self._listener.getsockname()
        self.address = (
            f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
        )
        self._thread = threading.Thread(target=self._accept, name="regency-debugger", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting clients."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, peer = self._listener.accept()
            except OSError as exc:
                if self._closed:
                    return
                log.warning("debugger server: accept failed: %s", exc)
                threading.Event().wait(0.5)  # EMFILE and the like: back off, don't spin
                continue
            with self._lock:
                admitted = self._handshaking < MAX_HANDSHAKES
                self._handshaking += admitted
            if not admitted or self._limiter.blocked(peer_key(sock)) > 0:
                if admitted:
                    self._handshake_done()
                sock.close()
                continue
            threading.Thread(
                target=self._serve,
                args=(sock, f"{peer}"),
                name="regency-debugger-client",
                daemon=True,
            ).start()

    def _handshake_done(self) -> None:
        with self._lock:
            self._handshaking -= 1

    def _authenticate(self, channel: LineChannel) -> bool:
        challenge = secrets.token_hex(16)
        channel.sock.settimeout(HANDSHAKE_TIMEOUT)  # one deadline for the whole handshake
        channel.send(challenge=challenge, server="regency debugger")
        answer = channel.receive().get("proof")
        if not isinstance(answer, str):
            return False
        good = [proof(token, challenge) for token in self._tokens()]
        return any(hmac.compare_digest(answer, expected) for expected in good)

    def _serve(self, sock: socket.socket, peer: str) -> None:
        channel = LineChannel(sock)
        key = peer_key(sock)
        try:
            try:
                ok = self._authenticate(channel)
            except (OSError, WireError):
                ok = False
            finally:
                self._handshake_done()
            if not ok:
                self._limiter.failed(key)
                with contextlib.suppress(OSError):
                    channel.send(error="authentication failed: wrong or missing secret")
                return
            self._limiter.succeeded(key)
            sock.settimeout(None)
            with self._lock:
                busy, self._attached = self._attached, self._attached or peer
            if busy is not None:
                channel.send(error=f"another regency debug client ({busy}) is attached")
                return
            try:
                channel.send(ok=True)
                DebugRepl(self._sessions, _Client(channel)).run()
                with contextlib.suppress(OSError):
                    channel.send(bye="")
            finally:
                with self._lock:
                    self._attached = None
        except OSError:
            pass
        finally:
            channel.close()
