"""Dialing a peer: where to connect, the route preamble, TLS, the secret handshake.

The dialer's counterpart of :mod:`regency._transport.inbound`. A peer's address says where it
is; :class:`Paths` says how this process gets there when that is not a plain connect:

- ``tcp://host:port[/NAME]``: connect to ``host:port`` (or to the local end of its forward,
  ``via``), name ``NAME`` in the preamble;
- ``unix:`` on this machine: connect to the socket;
- ``unix:`` on the controller's machine, seen from another host: through the controller's
  ``gateway`` (its TCP listener), naming the address in the preamble, or, when the controller
  cannot be dialed from here, over a reverse connection it opens (``reverse``, see
  :mod:`regency._transport.reverse`).

TLS runs when it applies to the host the peer is on (the named host, not the local end of a
forward); the preamble tells the listener so. :func:`dial` retries while the peer is not
listening yet, until a deadline. :class:`Peer` and :class:`Queued` hold the frames sent to a
peer while its connection is being dialed.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from regency._transport import address as addr
from regency._transport import routing, tls
from regency._transport.auth import AuthenticationError, dialer_handshake
from regency._transport.connection import Buffer, Connection
from regency._transport.names import Named
from regency._transport.tls import Stream

log = logging.getLogger("regency.transport")

# Opens a reverse connection to the controller's machine within the timeout.
ReverseDial = Callable[[float], socket.socket]


@dataclass
class Paths:
    """How this process reaches peers it cannot simply connect to."""

    # Where ``unix:`` peers are reached from another machine (None: they are local).
    gateway: str | None = None
    # ``tcp://host:port`` of a worker -> the ``tcp://`` address that forwards to it (the
    # local end of a ``kubectl port-forward``); the peer keeps its own address.
    via: dict[str, str] = field(default_factory=dict)
    # Opens reverse connections to the controller's machine (None: ``unix:`` peers are local
    # or behind ``gateway``).
    reverse: ReverseDial | None = None

    def remote_unix(self) -> bool:
        """Whether ``unix:`` peers are on another machine."""
        return self.gateway is not None or self.reverse is not None

    def target(self, host_port: str) -> str:
        """The ``tcp://host:port`` to connect to for a host at ``host_port``."""
        return self.via.get(host_port, host_port)


def connect(
    peer: str,
    secret: bytes,
    timeout: float,
    own_address: str,
    paths: Paths,
    tune: Callable[[socket.socket], None],
) -> Stream:
    """A connected, authenticated socket to ``peer``, proving ``secret`` and announcing
    ``own_address``."""
    key: str | None = None
    if addr.is_tcp(peer):
        key, on_tls = addr.route_key(peer), tls.applies(addr.tcp_host(peer))
        raw = addr.dial(paths.target(addr.host_port(peer)), timeout=timeout)
    elif paths.gateway is not None:
        gateway = paths.gateway
        key, on_tls = peer, tls.applies(addr.tcp_host(gateway))
        raw = addr.dial(paths.target(addr.host_port(gateway)), timeout=timeout)
    elif paths.reverse is not None:
        # The controller's machine is another host, however the connection got here.
        key, on_tls = peer, tls.enabled()
        raw = paths.reverse(timeout)
        raw.settimeout(timeout)
    else:
        raw = addr.dial(peer, timeout=timeout)
    sock: Stream = raw
    try:
        if key is not None:
            tune(raw)
            raw.sendall(routing.preamble(key, tls=on_tls))
            if on_tls:
                sock = tls.wrap_client(raw, secret)
        dialer_handshake(sock, secret, own_address)
    except ssl.SSLError as exc:
        sock.close()
        raise handshake_failure(exc) from None
    except BaseException:
        sock.close()
        raise
    return sock


_RETRYABLE = {errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN, errno.ECONNRESET}


def handshake_failure(exc: ssl.SSLError) -> OSError:
    """The error a failed TLS handshake as the dialer raises: :class:`AuthenticationError`,
    except when the peer only hung up in the middle (its own deadline passed while it was too
    busy to finish, or it is closing), which is worth another try like a reset."""
    if isinstance(exc, ssl.SSLEOFError) or exc.reason == "UNEXPECTED_EOF_WHILE_READING":
        return ConnectionResetError(
            errno.ECONNRESET, f"the peer hung up during the TLS handshake ({exc.reason or exc})"
        )
    return AuthenticationError(tls.failure(exc))


def dial(
    peer: str,
    connect: Callable[[float], Stream],
    timeout: float,
    attempt_timeout: float,
    given_up: Callable[[], bool],
) -> tuple[Stream | None, str]:
    """Connect to ``peer`` with ``connect(limit)`` (one attempt, at most ``attempt_timeout``
    seconds), retrying while it is not listening yet or hangs up before the handshake is done
    (not when it refuses the proof), for ``timeout`` seconds or until ``given_up()``; return
    the stream, or ``None`` and why it could not be had."""
    started = time.monotonic()
    deadline = started + timeout
    delay = 0.002
    sock: Stream | None = None
    reason = "unknown error"
    while not given_up():
        try:
            left = max(0.05, deadline - time.monotonic())
            sock = connect(min(attempt_timeout, left))
            break
        except AuthenticationError as exc:
            reason = f"authentication failed: {exc}"
            log.error("connection to %s refused: %s", peer, reason)
            break
        except (OSError, addr.AddressError) as exc:
            reason = str(exc) or type(exc).__name__
            timed_out = isinstance(exc, TimeoutError)
            # A peer that hung up before the handshake may only have been too busy to answer
            # in its deadline (hundreds of dials at once): tried again while ours allows.
            hung_up = type(exc) is ConnectionError
            retry = timed_out or hung_up or (isinstance(exc, OSError) and exc.errno in _RETRYABLE)
            if retry and time.monotonic() + delay > deadline:
                # Say how long it really waited (one attempt lasts at most the handshake
                # timeout; a timed-out one is retried while the deadline allows).
                waited = time.monotonic() - started
                reason = f"no answer within {round(waited, 1):g} s ({reason})"
                break
            if not retry:
                break
            if not timed_out:
                time.sleep(delay)
            delay = min(delay * 2, 0.05)
    return sock, reason


class Queued:
    """Frame buffers waiting for a connection (and the part they name, if any: see
    :mod:`.names`), and whether they made it."""

    __slots__ = ("buffers", "done", "named", "sent")

    def __init__(
        self, buffers: list[Buffer], done: threading.Event | None, named: Named | None = None
    ) -> None:
        self.buffers = buffers
        self.done = done
        self.named = named
        self.sent = False

    def finish(self, sent: bool) -> None:
        """Record whether the frame went out, and wake a sender waiting for it."""
        self.sent = sent
        if self.done is not None:
            self.done.set()


class Peer:
    """Where frames to one peer go: a queue while dialing, then a connection."""

    __slots__ = ("conn", "queue")

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.queue: list[Queued] = []
