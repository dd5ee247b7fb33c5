"""Reverse connections: how processes reach a controller they cannot dial.

A controller outside a cluster reaches each worker only through a forwarded port (``kubectl
port-forward``), and nothing in the cluster can dial the controller back. Connections that the
cluster's side would open are opened by the controller instead, through the same forward, and
then run exactly as if the other side had dialed:

1. A process on the worker host that needs a connection to one of the controller's processes
   (the controller itself, or a proc on its machine) makes a random token and waits on it. A
   proc asks its host over its handoff channel (``Q`` + token); the worker asks the controller
   with a :data:`KIND_REVERSE` frame on its own connection to it, the one the controller opened
   when it attached.
2. The controller dials the worker's address (through the forward) and sends a reverse preamble
   naming the token (:func:`regency._transport.routing.reverse_preamble`); it then treats the
   socket as one its gateway accepted.
3. The worker hands the socket to the process waiting on the token (``R`` + token on its
   handoff channel, or its own waiting dial). That process carries on as a dialer: route
   preamble naming the process it wants, TLS as the client, the secret handshake.

So TLS and the secret handshake run end to end between the two processes, as on any other
connection; the worker only passes a descriptor on. A token is random, used once and forgotten
after a while: a connection that names an unknown token is closed, and one that names a token it
overheard reaches a process that then fails the stranger's TLS and secret handshake (and dials
again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable

from regency._transport import address as addr
from regency._transport import frames, routing
from regency._transport.connection import Connection, ConnectionClosedError

log = logging.getLogger("regency.transport")

TOKEN_BYTES = 16
KIND_REVERSE = 255  # a transport-level frame (like heartbeats): part 0 is the token


def request_frame(token: bytes) -> list[bytes | bytearray | memoryview]:
    """The frame a worker sends the controller to ask for a reverse connection."""
    return frames.encode(KIND_REVERSE, 0, [token], limit=1024)


def token_of(frame: frames.Frame) -> bytes | None:
    """The token a :data:`KIND_REVERSE` frame asks for (``None``: not a valid request)."""
    if len(frame.parts) != 1 or frame.parts[0].nbytes != TOKEN_BYTES:
        return None
    return bytes(frame.parts[0])


def ask(token: bytes, conn: Connection | None, handoff: socket.socket | None) -> bool:
    """Ask for a reverse connection for ``token``: of the controller over ``conn`` (a worker's
    connection to it), else of this process's host over ``handoff``; ``False`` if neither
    can be asked."""
    try:
        if conn is not None:
            conn.send(request_frame(token), wait=False)
        elif handoff is not None:
            routing.ask_reverse(handoff, token)
        else:
            return False
    except (ConnectionClosedError, OSError):
        return False
    return True


def answer(
    conn: Connection,
    frame: frames.Frame,
    target: Callable[[str], str],
    timeout: float,
    tune: Callable[[socket.socket], None],
    accept: Callable[[socket.socket, str], None],
) -> None:
    """The controller's side of a worker's request on ``conn``: dial the worker back (at
    ``target(its host:port)``, the local end of its forward) in a thread of its own, then
    ``accept(sock, worker IP)``: the connection counts as one arriving from that host."""
    token = token_of(frame)
    if token is None or not conn.tcp or not addr.is_tcp(conn.peer):
        log.warning("ignored a malformed reverse connection request from %s", conn.peer)
        return
    host = addr.host_port(conn.peer)

    def dial() -> None:
        try:
            sock = dial_back(target(host), token, timeout, tune)
        except OSError as exc:
            log.warning("could not open a reverse connection to %s: %s", host, exc)
            return
        accept(sock, addr.tcp_host(host))

    threading.Thread(target=dial, name="regency-dial-back", daemon=True).start()


def dial_back(
    target: str, token: bytes, timeout: float, tune: Callable[[socket.socket], None]
) -> socket.socket:
    """The controller's side: connect to ``target`` (the worker's port, or the local end of
    its forward) and open a reverse connection for ``token``."""
    sock = addr.dial(target, timeout=timeout)
    try:
        tune(sock)
        sock.sendall(routing.reverse_preamble(token))
    except BaseException:
        sock.close()
        raise
    return sock


class Waits:
    """The dials of this process waiting for their reverse connection, by token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[bytes, list[socket.socket]] = {}
        self._events: dict[bytes, threading.Event] = {}

    def new(self) -> bytes:
        """A fresh token to wait on."""
        token = os.urandom(TOKEN_BYTES)
        with self._lock:
            self._slots[token] = []
            self._events[token] = threading.Event()
        return token

    def deliver(self, token: bytes, sock: socket.socket) -> bool:
        """Give ``sock`` to the dial waiting on ``token``; ``False`` if none is (the caller
        keeps the socket)."""
        with self._lock:
            slot = self._slots.get(token)
            if slot is None or slot:
                return False
            slot.append(sock)
            self._events[token].set()
        return True

    def cancel(self, token: bytes) -> None:
        """Stop waiting on ``token`` (its request could not be sent)."""
        with self._lock:
            self._slots.pop(token, None)
            self._events.pop(token, None)

    def take(self, token: bytes, timeout: float) -> socket.socket:
        """The reverse connection for ``token``, once it arrives; ``TimeoutError`` after
        ``timeout`` seconds (a late one is then closed on arrival)."""
        with self._lock:
            event = self._events.get(token)
        if event is not None:
            event.wait(timeout)
        with self._lock:
            slot = self._slots.pop(token, [])
            self._events.pop(token, None)
        if not slot:
            raise TimeoutError(f"no reverse connection within {timeout:g} s")
        return slot[0]

    def close(self) -> None:
        """Close the connections delivered but not taken."""
        with self._lock:
            socks = [s for slot in self._slots.values() for s in slot]
            self._slots.clear()
            events = list(self._events.values())
        for event in events:
            event.set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
