"""The controller's debugger server: authenticated ``regency debug`` clients on a TCP port.

It listens on loopback unless ``REGENCY_DEBUG_SERVER_HOST`` names another address, on
``REGENCY_DEBUG_SERVER_PORT`` or a free port, from a thread of its own. A connection must finish
the handshake of :mod:`regency.observe.debug_wire` within :data:`HANDSHAKE_TIMEOUT` seconds
from its accept, however it trickles its bytes. Clients are told apart by what the kernel says
(:func:`regency.observe.admission.client_key`: this user, another local user by uid, another
machine by address), not by address alone: this user's own handshakes have
:data:`MAX_HANDSHAKES` slots of their own, everybody else shares :data:`MAX_HANDSHAKES`, at most
:data:`MAX_HANDSHAKES_PER_CLIENT` each, and one more pushes out the oldest of its kind. A client
that failed too often is refused for a while
(:class:`regency._transport.ratelimit.FailureLimiter`), which never applies to this user (who
could read the secret anyway), so others' failures cannot lock the owner out. One client is
served at a time: two clients typing into the same ``pdb`` would confuse both, so a second one
is told who is attached and closed.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import select
import socket
import threading
from collections.abc import Callable

from regency._transport.ratelimit import FailureLimiter
from regency._transport.ratelog import RateLimitedLog
from regency.observe.admission import Admission, client_key, describe
from regency.observe.debug_repl import DebugRepl
from regency.observe.debug_sessions import Sessions
from regency.observe.debug_wire import HANDSHAKE_LINE, LineChannel, WireError, proof

log = logging.getLogger("regency.debugger")

HOST_ENV = "REGENCY_DEBUG_SERVER_HOST"
PORT_ENV = "REGENCY_DEBUG_SERVER_PORT"
HANDSHAKE_TIMEOUT = 5.0
MAX_HANDSHAKES = 16
MAX_HANDSHAKES_PER_CLIENT = 4
_SWEEP_EVERY = 0.25


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
        self._listener.listen(1024)  # a burst waits in the kernel, not in SYN retries
        self._listener.setblocking(False)
        self._sessions = sessions
        self._tokens = tokens
        self._limiter = FailureLimiter()
        self._refused = RateLimitedLog(log)
        self._lock = threading.Lock()
        self._handshaking: Admission[socket.socket] = Admission(
            MAX_HANDSHAKES, MAX_HANDSHAKES_PER_CLIENT, MAX_HANDSHAKES
        )
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
        self._thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sweep = _SWEEP_EVERY if len(self._handshaking) else None  # idle: just wait
                readable, _, _ = select.select([self._listener], [], [], sweep)
            except (OSError, ValueError):
                return  # closed
            self._cut_slow_handshakes()
            if not readable or self._closed:
                continue
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                continue
            except OSError as exc:
                if self._closed:
                    return
                self._refused.warning("debugger server: accept failed: %s", exc)
                threading.Event().wait(0.5)  # EMFILE and the like: back off, don't spin
                continue
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: object) -> None:
        key = client_key(sock)
        wait = self._limiter.blocked(key)
        if wait > 0:
            self._refused.warning(
                "debugger server: refused %s for %.1f s more: too many failed handshakes",
                describe(key),
                wait,
            )
            sock.close()
            return
        sock.setblocking(True)
        with self._lock:
            for old in self._handshaking.admit(key, sock):
                _cut(old)
                self._refused.warning(
                    "debugger server: closed the oldest handshake to admit one from %s "
                    "(at most %d per client, %d from others, %d from this user)",
                    describe(key),
                    MAX_HANDSHAKES_PER_CLIENT,
                    MAX_HANDSHAKES,
                    MAX_HANDSHAKES,
                )
        threading.Thread(
            target=self._serve,
            args=(sock, f"{peer}", key),
            name="regency-debugger-client",
            daemon=True,
        ).start()

    def _cut_slow_handshakes(self) -> None:
        with self._lock:
            for sock in self._handshaking.waiting_since(HANDSHAKE_TIMEOUT):
                self._handshaking.release(sock)
                _cut(sock)

    def _handshake_done(self, sock: socket.socket) -> None:
        with self._lock:
            self._handshaking.release(sock)

    def _authenticate(self, channel: LineChannel) -> bool:
        challenge = secrets.token_hex(16)
        channel.sock.settimeout(HANDSHAKE_TIMEOUT)  # and _cut_slow_handshakes, however it drips
        channel.send(challenge=challenge, server="regency debugger")
        answer = channel.receive(HANDSHAKE_LINE).get("proof")
        if not isinstance(answer, str):
            return False
        good = [proof(token, challenge) for token in self._tokens()]
        return any(hmac.compare_digest(answer, expected) for expected in good)

    def _serve(self, sock: socket.socket, peer: str, key: str | None) -> None:
        channel = LineChannel(sock)
        try:
            try:
                ok = self._authenticate(channel)
            except (OSError, WireError):
                ok = False
            finally:
                self._handshake_done(sock)
            if not ok:
                self._limiter.failed(key)
                self._refused.warning(
                    "debugger server: refused %s: wrong or missing secret, or too slow",
                    describe(key),
                )
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


def _cut(sock: socket.socket) -> None:
    """End a handshake from another thread: its blocked read returns at once."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
