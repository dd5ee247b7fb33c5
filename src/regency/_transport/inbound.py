"""Accepted connections until they are authenticated: route preamble, TLS, secret handshake.

Everything here runs on the I/O thread and guards the process against peers that never
authenticate:

- **one deadline** (``DEADLINE`` seconds) for the whole way from ``accept`` to an authenticated
  connection, whatever the peer sends meanwhile (a byte every few seconds does not extend it);
- **bounded**: at most ``PER_LISTENER`` connections still unauthenticated, and ``PER_PEER``
  from one peer (:func:`regency._transport.ratelimit.identify`: on this machine its uid, as
  the kernel says, whatever loopback address it dials from; else its address); a new one over
  the peer's bound pushes out that peer's oldest, over the listener's bound the oldest of the
  peer holding most (so a flood from one peer cannot keep a legitimate dialer from another, or
  a fresh one, out);
- **a proof is always judged**: a peer past its budget of failed handshakes (or all peers
  together past theirs) still gets the greeting, and a right proof is accepted at once; a wrong
  one is then held unanswered until the connection's deadline (it is not pushed out early,
  which would answer it, except to make room for the listener's own user when held ones fill
  the listener), so guesses cost a connection slot for ``DEADLINE`` seconds each and failures
  of others never lock out a peer that holds the secret. A wrong proof is answered with
  :data:`regency._transport.auth.REFUSED`, a hang-up without it means "busy";
- a peer that **hangs up** is closed at once;
- ``accept`` failing for lack of descriptors (``EMFILE``…) **backs off**: the listener leaves
  the epoll set for a growing pause (no busy loop), the oldest unauthenticated connection is
  closed to make room, and the log says so at a bounded rate.

TCP connections run TLS 1.3 (:mod:`regency._transport.tls`) before the secret handshake of
:mod:`regency._transport.auth`; nothing is unpickled before both succeed. The dialer's preamble
says whether TLS follows: a listener goes along with a dialer that starts TLS, and refuses one
that does not where TLS applies (the connection arrived from another host, judged by the
address it arrived at, or by the host a reverse connection was dialed to). So a listener on
loopback, which a forwarded port (``kubectl port-forward``) reaches, runs TLS for a dialer on
another machine that asks for it, and stripping the request on the way gets nothing: the dialer
never goes without TLS it asked for. A TCP listener reads exactly the route preamble and no
more, so a connection handed over to another process keeps the TLS bytes that follow it; the
host tells the process whether they are TLS.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import select
import socket
import ssl
from collections import OrderedDict
from collections.abc import Callable

from regency._transport import routing, tls
from regency._transport.auth import (
    REFUSED,
    AuthenticationError,
    ListenerHandshake,
    channel_binding,
)
from regency._transport.io_loop import IOLoop
from regency._transport.ratelimit import FailureLimiter, Peer, identify
from regency._transport.ratelog import RateLimitedLog

log = logging.getLogger("regency.transport")

DEADLINE = 10.0
PER_LISTENER = 256
PER_PEER = 64
_OUT_OF_FDS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_ACCEPTS_PER_WAKEUP = 64
_BACKOFF_FIRST = 0.05
_BACKOFF_MAX = 1.0

# (the authenticated socket, the peer's announced address)
Ready = Callable[[tls.Stream, str], None]
# Takes a connection whose preamble names another process (with whether TLS follows), or a
# reverse connection; False: it is for this process.
Elsewhere = Callable[[routing.Route, socket.socket, bool], bool]


def _local_ip(sock: socket.socket) -> str:
    """The address a connection arrived at (decides TLS as the dialer's target did)."""
    try:
        return str(sock.getsockname()[0])
    except OSError:
        return ""


def _peer_name(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "?"
    return str(name[0]) if isinstance(name, tuple) and name else "a local process"


class _Shake:
    """One connection on its way to authentication."""

    __slots__ = (
        "arrival",
        "fd",
        "held",
        "peer",
        "preamble",
        "raw",
        "routed",
        "shake",
        "sslsock",
        "stream",
        "use_tls",
        "where",
    )

    def __init__(
        self, sock: socket.socket, routed: bool, use_tls: bool | None, arrival: str | None
    ) -> None:
        self.raw = sock
        self.fd = sock.fileno()
        self.routed = routed
        self.peer: Peer = identify(sock)
        self.where = _peer_name(sock)
        self.held = False  # a wrong proof held unanswered until the deadline
        self.preamble = routing.PreambleReader() if routed else None
        self.use_tls = use_tls  # None: decided by the preamble, or by the arrival address
        self.arrival = arrival  # the IP that decides whether TLS applies (None: where it arrived)
        self.sslsock: ssl.SSLSocket | None = None
        self.stream: tls.Stream | None = None
        self.shake: ListenerHandshake | None = None

    @property
    def who(self) -> str:
        return self.peer.key

    def name(self) -> str:
        return f"{self.where} ({self.who})"

    def close(self) -> None:
        for s in (self.sslsock, self.raw):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()


class Inbound:
    """Takes accepted sockets through to authenticated connections (on the I/O thread)."""

    def __init__(
        self,
        loop: IOLoop,
        secrets: Callable[[], tuple[bytes, ...]],
        on_ready: Ready,
        elsewhere: Elsewhere,
        tune: Callable[[socket.socket], None],
        *,
        limit: int = PER_LISTENER,
        per_peer: int = PER_PEER,
        deadline: float | None = None,
        limiter: Callable[[], FailureLimiter] | None = None,
    ) -> None:
        self._loop = loop
        own = FailureLimiter()
        # Looked up per connection: the owner may replace its limiter (a fork starts afresh).
        self._limiter = limiter or (lambda: own)
        self._secrets = secrets
        self._on_ready = on_ready
        self._elsewhere = elsewhere
        self._tune = tune
        self._limit = limit
        self._per_peer = per_peer
        self._deadline_given = deadline
        self._pending: OrderedDict[int, _Shake] = OrderedDict()  # oldest first
        self._by_peer: dict[str, int] = {}
        self._backoff: dict[int, float] = {}
        self._rejects = RateLimitedLog(log)
        self._accept_errors = RateLimitedLog(log, burst=3)
        self._closed = False

    @property
    def _deadline(self) -> float:
        return DEADLINE if self._deadline_given is None else self._deadline_given

    def pending(self) -> int:
        """How many connections are still unauthenticated."""
        return len(self._pending)

    # -- accepting -----------------------------------------------------------------------------

    def listen(self, listener: socket.socket, routed: bool) -> None:
        """Accept connections on ``listener`` (``routed``: they start with a route preamble)."""
        listener.setblocking(False)
        self._loop.register(listener.fileno(), lambda _: self._accept(listener, routed))

    def _accept(self, listener: socket.socket, routed: bool) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                self._backoff.pop(listener.fileno(), None)
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    self._out_of_fds(listener, routed, exc)
                else:
                    self._accept_errors.warning("accept failed: %s", exc)
                return
            self._backoff.pop(listener.fileno(), None)
            self.take(sock, routed)

    def _out_of_fds(self, listener: socket.socket, routed: bool, exc: OSError) -> None:
        """Stop watching the listener for a while (it stays readable: no busy loop), and
        make room by closing the oldest unauthenticated connection."""
        fd = listener.fileno()
        delay = min(self._backoff.get(fd, _BACKOFF_FIRST / 2) * 2, _BACKOFF_MAX)
        self._backoff[fd] = delay
        evicted = self._evict_oldest("closed to free a descriptor")
        self._accept_errors.warning(
            "accept failed: %s; pausing this listener for %.2f s%s",
            exc,
            delay,
            " (closed the oldest unauthenticated connection)" if evicted else "",
        )
        self._loop.unregister(fd)

        def resume() -> None:
            if self._closed or listener.fileno() < 0:
                return
            self._loop.register(fd, lambda _: self._accept(listener, routed))

        self._loop.call_later(delay, resume)

    # -- admission -----------------------------------------------------------------------------

    def take(
        self,
        sock: socket.socket,
        routed: bool,
        *,
        use_tls: bool | None = None,
        arrival: str | None = None,
    ) -> None:
        """Start authenticating an accepted (or handed-over) connection.

        ``routed``: it starts with a route preamble. ``use_tls``: whether it runs TLS, when
        another process read its preamble (``None``: the preamble decides, or for a listener
        without preambles the address it arrived at). ``arrival``: the IP that decides whether
        TLS is required, instead of the one the socket arrived at (a reverse connection counts
        as arriving from the host it was dialed to).
        """
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:
            self._tune(sock)
        shake = _Shake(sock, routed, use_tls, arrival)
        if self._by_peer.get(shake.who, 0) >= self._per_peer and not self._evict_oldest(
            "too many unauthenticated connections from this peer", shake.who
        ):
            self._turn_away(shake, "this peer's held connections fill its share")
            return
        if len(self._pending) >= self._limit and not self._evict_oldest(
            "too many unauthenticated connections", self._busiest(), not shake.peer.limited
        ):
            self._turn_away(shake, "held connections fill the listener")
            return
        self._pending[shake.fd] = shake
        self._by_peer[shake.who] = self._by_peer.get(shake.who, 0) + 1
        self._loop.register(shake.fd, lambda ev: self._readable(shake, ev), _EVENTS)
        self._loop.call_later(self._deadline, lambda: self._expire(shake))
        if not routed:
            self._start_auth(shake)

    def _release(self, shake: _Shake) -> bool:
        """Take ``shake`` off the books; whether it was still on them."""
        if self._pending.get(shake.fd) is not shake:
            return False
        del self._pending[shake.fd]
        left = self._by_peer[shake.who] - 1
        if left:
            self._by_peer[shake.who] = left
        else:
            del self._by_peer[shake.who]
        self._loop.unregister(shake.fd)
        return True

    def _reject(self, shake: _Shake, reason: str) -> None:
        if self._release(shake):
            self._rejects.warning("rejected a connection from %s: %s", shake.name(), reason)
            shake.close()

    def _evict_oldest(self, reason: str, who: str | None = None, held_too: bool = False) -> bool:
        """Push out the oldest unauthenticated connection (of peer ``who``) that has not been
        judged; whether there was one. A held wrong proof is answered early only with
        ``held_too`` (room for the listener's own user: one early verdict per such dial)."""
        for held in (False, True) if held_too else (False,):
            for shake in self._pending.values():
                if (who is None or shake.who == who) and shake.held == held:
                    self._reject(shake, reason)
                    return True
        return False

    def _busiest(self) -> str | None:
        """The peer holding the most unauthenticated connections."""
        return max(self._by_peer, key=self._by_peer.__getitem__, default=None)

    def _turn_away(self, shake: _Shake, reason: str) -> None:
        """Close a fresh connection that finds no room (it was never counted)."""
        self._rejects.warning("rejected a connection from %s: %s", shake.name(), reason)
        shake.close()

    def _expire(self, shake: _Shake) -> None:
        if self._pending.get(shake.fd) is not shake:
            return
        if shake.held:
            self._refuse(shake, "peer failed authentication (held until the deadline)")
            return
        self._reject(shake, f"handshake timed out (not authenticated within {self._deadline:g} s)")

    def _refuse(self, shake: _Shake, reason: str) -> None:
        """Answer a wrong proof with :data:`REFUSED` (best effort) and close."""
        if shake.stream is not None and self._pending.get(shake.fd) is shake:
            with contextlib.suppress(OSError):
                shake.stream.send(REFUSED)
        self._reject(shake, reason)

    def _failed_proof(self, shake: _Shake, exc: AuthenticationError) -> None:
        """A wrong proof: counted; answered at once within the peer's budget, else held."""
        limiter = self._limiter()
        key = shake.who if shake.peer.limited else None
        limiter.failed(key)
        if not limiter.over_budget(key):
            self._refuse(shake, str(exc))
            return
        shake.held = True
        self._loop.unregister(shake.fd)
        log.debug("holding %s's wrong proof until its deadline: %s", shake.name(), exc)

    # -- the stages ----------------------------------------------------------------------------

    def _readable(self, shake: _Shake, events: int) -> None:
        if self._pending.get(shake.fd) is not shake:
            return
        try:
            if shake.preamble is not None:
                self._read_preamble(shake)
            elif shake.sslsock is not None and shake.stream is None:
                self._step_tls(shake)
            else:
                self._read_proof(shake)
        except routing.RouteError as exc:
            self._reject(shake, str(exc))
        except AuthenticationError as exc:
            self._failed_proof(shake, exc)
        except ssl.SSLError as exc:
            self._reject(shake, tls.failure(exc))
        except OSError as exc:
            self._reject(shake, f"read failed before authentication: {exc}")
        hung_up = events & (select.EPOLLHUP | select.EPOLLERR)
        if hung_up and self._pending.get(shake.fd) is shake and not shake.held:
            self._reject(shake, "peer hung up before authenticating")

    def _read_preamble(self, shake: _Shake) -> None:
        reader = shake.preamble
        assert reader is not None
        try:
            data = shake.raw.recv(reader.missing())
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self._reject(shake, "peer hung up before naming a route")
            return
        route = reader.feed(data)
        if route is None:
            return
        shake.preamble = None
        if not route.reverse:
            shake.use_tls = route.tls or self._refuse_plain(shake)
        # Out of the epoll set before the descriptor may travel to another process.
        self._loop.unregister(shake.fd)
        if self._elsewhere(route, shake.raw, bool(shake.use_tls)):
            self._release(shake)  # handed over or refused there: no longer ours
            return
        if route.reverse:
            self._reject(shake, "a reverse connection nobody here asked for")
            return
        self._loop.register(shake.fd, lambda ev: self._readable(shake, ev), _EVENTS)
        self._start_auth(shake)

    def _refuse_plain(self, shake: _Shake) -> bool:
        """A dialer that does not start TLS: fine where TLS does not apply (``False``), else
        refused (``RouteError``)."""
        if tls.applies(shake.arrival or _local_ip(shake.raw)):
            raise routing.RouteError(
                "the dialer did not start TLS, which connections from other hosts need "
                "(is REGENCY_TLS=0 set on one end only?)"
            )
        return False

    def _start_auth(self, shake: _Shake) -> None:
        use_tls = shake.use_tls
        if use_tls is None:
            use_tls = tls.applies(shake.arrival or _local_ip(shake.raw))
        if shake.raw.family != socket.AF_UNIX and use_tls:
            shake.sslsock = tls.wrap_server(shake.raw, self._secrets())
            self._step_tls(shake)
        else:
            shake.stream = shake.raw
            self._send_hello(shake)

    def _step_tls(self, shake: _Shake) -> None:
        sslsock = shake.sslsock
        assert sslsock is not None
        if not tls.step_handshake(sslsock):
            return
        shake.stream = tls.SecureSocket(sslsock)
        self._send_hello(shake)

    def _send_hello(self, shake: _Shake) -> None:
        stream = shake.stream
        assert stream is not None
        try:
            shake.shake = ListenerHandshake(*self._secrets(), channel=channel_binding(stream))
            stream.send(shake.shake.hello())
        except OSError as exc:
            self._reject(shake, f"write failed during the handshake: {exc}")
            return
        if isinstance(stream, tls.SecureSocket) and stream.pending():
            self._read_proof(shake)

    def _read_proof(self, shake: _Shake) -> None:
        stream, handshake = shake.stream, shake.shake
        assert stream is not None
        assert handshake is not None
        while True:
            try:
                data = stream.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                self._reject(shake, "peer hung up during the handshake")
                return
            proof = handshake.feed(data)
            if proof is not None:
                break
            if not isinstance(stream, tls.SecureSocket) or not stream.pending():
                return
        try:
            stream.send(proof)
        except OSError as exc:
            self._reject(shake, f"write failed during the handshake: {exc}")
            return
        if self._release(shake):
            self._limiter().succeeded(shake.who if shake.peer.limited else None)
            self._on_ready(stream, handshake.peer_address or "unknown")

    def close(self) -> None:
        """Close every connection still unauthenticated."""
        self._closed = True
        for shake in list(self._pending.values()):
            if self._release(shake):
                shake.close()


_EVENTS = select.EPOLLIN | select.EPOLLRDHUP
