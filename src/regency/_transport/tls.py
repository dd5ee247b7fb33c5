"""Mutual TLS 1.3 for every TCP connection: identities, contexts, and a socket that speaks it.

Every TCP connection between hosts (worker ports, the controller's gateway, routed connections
handed to a proc, the RDMA transfer service) runs TLS 1.3 with certificates checked on both
sides before the secret handshake of :mod:`regency._transport.auth` runs inside it; unix
sockets stay plain.

Whose certificates:

- **Per job, by default**: a CA and one leaf certificate derived from the secret a connection
  proves (HKDF → Ed25519 keys, fixed fields). Whoever holds the secret derives the same CA, so
  the certificates travel exactly where the secret travels (environment, secret file, stdin,
  the bootstrap pipe) and never on a command line. The dialer names the secret's CA in SNI
  (``server_name``) so a listener that accepts several secrets presents the matching
  certificate.
- **User-provided**: ``REGENCY_TLS_CA``, ``REGENCY_TLS_CERT`` and ``REGENCY_TLS_KEY`` (paths to
  PEM files: Monarch's ``HYPERACTOR_TLS_{CA,CERT,KEY}``), or ``ca=``/``private_key=`` of
  ``attach_to_workers`` and ``run_worker_loop_forever``. Then every TCP connection of the
  process presents that certificate and trusts only that CA; procs inherit the identity
  through their bootstrap settings.

TCP connections over loopback stay plain (there is no path to be on) unless ``REGENCY_TLS=all``;
``REGENCY_TLS=0`` turns TLS off (both ends must agree; a mismatch fails the handshake).

:class:`SecureSocket` wraps an ``ssl.SSLSocket`` with the methods the connection, the frame
reader and the handshakes use (``sendmsg``, ``recv_into``…). OpenSSL objects must not be used
by two threads at once, so every TLS call holds the socket's lock; calls never block while
holding it (the socket is non-blocking once the handshake is done).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ENABLE_ENV = "REGENCY_TLS"
CA_ENV = "REGENCY_TLS_CA"
CERT_ENV = "REGENCY_TLS_CERT"
KEY_ENV = "REGENCY_TLS_KEY"
_OFF = {"0", "off", "false", "no"}
_EVERYWHERE = {"all", "loopback", "everywhere"}
_SNI_SUFFIX = ".regency"
_USER_SNI = "user" + _SNI_SUFFIX


class TLSSetupError(ValueError):
    """TLS material that cannot be used: missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class Identity:
    """A CA certificate to trust, and the certificate and key to present (all PEM)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def export(self) -> dict[str, bytes]:
        """The identity as plain data (for a proc's bootstrap settings)."""
        return {"ca": self.ca_pem, "cert": self.cert_pem, "key": self.key_pem}


_state_lock = threading.Lock()
_user: Identity | None = None
_user_loaded = False
_forced: str | None = None


def _mode() -> str:
    if _forced is not None:
        return _forced
    value = os.environ.get(ENABLE_ENV, "1").strip().lower()
    if value in _OFF:
        return "off"
    return "all" if value in _EVERYWHERE else "on"


def enabled() -> bool:
    """Whether TCP connections of this process that leave loopback use TLS (default: yes)."""
    return _mode() != "off"


def applies(ip: str) -> bool:
    """Whether a TCP connection to (or accepted on) local or remote address ``ip`` runs TLS.

    Loopback connections stay plain unless ``REGENCY_TLS=all``: they never leave the machine,
    so there is no path to be on (they are authenticated with the secret like unix sockets).
    Both ends decide alike: the dialer by the address it dials, the listener by the address
    the connection arrived at.
    """
    mode = _mode()
    if mode == "off":
        return False
    return mode == "all" or not _is_loopback(ip)


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.strip("[]")).is_loopback
    except ValueError:
        return ip == "localhost"


def force_enabled(on: bool | str | None) -> None:
    """Override ``REGENCY_TLS`` for this process: ``True`` (across hosts), ``"all"`` (loopback
    too), ``False`` (off), ``None`` (read the environment again). For tests and benchmarks."""
    global _forced
    _forced = None if on is None else ("all" if on == "all" else "on" if on else "off")


def _read_pem(value: bytes | str | Path, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as exc:
        raise TLSSetupError(f"cannot read the TLS {what} from {value}: {exc}") from None


def set_user_identity(identity: Identity | None) -> None:
    """Present ``identity`` on every TCP connection of this process (``None``: back to the
    environment's, or the per-job one)."""
    global _user, _user_loaded
    if identity is not None:
        _validate(identity)
    with _state_lock:
        _user, _user_loaded = identity, identity is not None
    _contexts.cache_clear()
    _server_context.cache_clear()


def identity_from(
    ca: bytes | str | Path, private_key: bytes | str | Path, cert: bytes | str | Path | None
) -> Identity:
    """An identity from Monarch-style arguments: ``ca`` (PEM or path), ``private_key`` (PEM or
    path; it may also hold the certificate) and ``cert`` (PEM or path; default: the one in
    ``private_key``, else ``REGENCY_TLS_CERT``)."""
    key_pem = _read_pem(private_key, "private key")
    if cert is None:
        env_cert = os.environ.get(CERT_ENV)
        if b"-----BEGIN CERTIFICATE-----" in key_pem:
            cert_pem = key_pem
        elif env_cert:
            cert_pem = _read_pem(env_cert, "certificate")
        else:
            raise TLSSetupError(
                "private_key holds no certificate: put the certificate in the same PEM or set "
                f"{CERT_ENV}"
            )
    else:
        cert_pem = _read_pem(cert, "certificate")
    return Identity(_read_pem(ca, "CA certificate"), cert_pem, key_pem)


def user_identity() -> Identity | None:
    """The identity set for this process, else the one ``REGENCY_TLS_{CA,CERT,KEY}`` name."""
    global _user, _user_loaded
    with _state_lock:
        if _user_loaded:
            return _user
        names = [os.environ.get(k, "") for k in (CA_ENV, CERT_ENV, KEY_ENV)]
        if not any(names):
            identity = None
        elif not all(names):
            raise TLSSetupError(f"set all of {CA_ENV}, {CERT_ENV} and {KEY_ENV}, or none")
        else:
            ca, cert, key = names
            identity = Identity(
                _read_pem(ca, "CA certificate"),
                _read_pem(cert, "certificate"),
                _read_pem(key, "private key"),
            )
            _validate(identity)
        _user, _user_loaded = identity, True
        return identity


def settings_for_children() -> dict[str, object]:
    """This process's TLS choices as plain data, for the procs it starts (their bootstrap
    settings): whether TLS is on, and the user identity if there is one."""
    identity = user_identity()
    return {"mode": _mode(), "identity": identity.export() if identity else None}


def install(settings: dict[str, object] | None) -> None:
    """Take the TLS choices a proc's host passed in its bootstrap settings."""
    if not settings:
        return
    mode = settings.get("mode")
    if isinstance(mode, str):
        force_enabled("all" if mode == "all" else mode == "on")
    exported = settings.get("identity")
    if isinstance(exported, dict):
        set_user_identity(Identity(exported["ca"], exported["cert"], exported["key"]))


# -- per-job identities ---------------------------------------------------------------------


def _fingerprint(secret: bytes) -> str:
    return hashlib.sha256(b"regency tls name" + secret).hexdigest()[:24]


def server_name(secret: bytes) -> str:
    """What a dialer proving ``secret`` names in SNI: which CA it trusts (not secret itself)."""
    if user_identity() is not None:
        return _USER_SNI
    return f"j{_fingerprint(secret)}{_SNI_SUFFIX}"


@functools.lru_cache(maxsize=16)
def derived_identity(secret: bytes) -> Identity:
    """The job's CA and leaf certificate, derived from ``secret`` (the same in every process)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def key(label: bytes) -> Ed25519PrivateKey:
        seed = HKDF(hashes.SHA256(), 32, salt=b"regency-tls-v1", info=label).derive(secret)
        return Ed25519PrivateKey.from_private_bytes(seed)

    ca_key, leaf_key = key(b"ca"), key(b"leaf")
    tag = _fingerprint(secret)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"regency job CA {tag}")])
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"regency job {tag}")])
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    end = datetime.datetime(2200, 1, 1, tzinfo=datetime.timezone.utc)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, None)
    )
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(leaf_name)
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(2)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, None)
    )
    pem = serialization.Encoding.PEM
    return Identity(
        ca_cert.public_bytes(pem),
        leaf_cert.public_bytes(pem),
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def generate_ca_and_leaf(common_name: str = "regency") -> tuple[Identity, bytes]:
    """A fresh random CA and a leaf it signed: the identity, and the CA's private key (PEM).

    For users who want certificates of their own (``REGENCY_TLS_*``) and for tests.
    """
    return _signed_by(None, common_name)


def _pkcs8(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    assert isinstance(key, Ed25519PrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _signed_by(ca: tuple[bytes, bytes] | None, common_name: str) -> tuple[Identity, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.x509.oid import NameOID

    pem = serialization.Encoding.PEM
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    end = start + datetime.timedelta(days=3650)
    if ca is None:
        ca_key = Ed25519PrivateKey.generate()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, None)
        )
    else:
        ca_cert = x509.load_pem_x509_certificate(ca[0])
        loaded = serialization.load_pem_private_key(ca[1], None)
        assert isinstance(loaded, Ed25519PrivateKey)
        ca_key = loaded
    leaf_key = Ed25519PrivateKey.generate()
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, None)
    )
    identity = Identity(
        ca_cert.public_bytes(pem),
        leaf.public_bytes(pem),
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    ca_key_pem = ca_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return identity, ca_key_pem


# -- contexts ---------------------------------------------------------------------------------


def _load_chain(ctx: ssl.SSLContext, identity: Identity) -> None:
    """Load the certificate and key (``ssl`` reads them from files only: a private, unlinked
    temporary file)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, not disk
    fd, path = tempfile.mkstemp(prefix="regency-tls-", suffix=".pem", dir=shm)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(identity.cert_pem.rstrip() + b"\n" + identity.key_pem)
        ctx.load_cert_chain(path)
    except ssl.SSLError as exc:
        raise TLSSetupError(f"the TLS certificate and key do not load: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _base(server: bool, identity: Identity) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # peers are named by address; the job's CA is what counts
    ctx.verify_mode = ssl.CERT_REQUIRED
    if server:
        ctx.num_tickets = 0  # no session tickets: nothing is written after the handshake
    try:
        ctx.load_verify_locations(cadata=identity.ca_pem.decode("ascii", errors="replace"))
    except ssl.SSLError as exc:
        raise TLSSetupError(f"the TLS CA certificate does not load: {exc}") from None
    _load_chain(ctx, identity)
    return ctx


def _validate(identity: Identity) -> None:
    _base(True, identity)


def _identity_for(secret: bytes) -> Identity:
    return user_identity() or derived_identity(secret)


@functools.lru_cache(maxsize=32)
def _contexts(secret: bytes, server: bool) -> ssl.SSLContext:
    return _base(server, _identity_for(secret))


def client_context(secret: bytes) -> ssl.SSLContext:
    """The context a dialer proving ``secret`` uses."""
    return _contexts(secret, False)


def server_context(secrets: Sequence[bytes]) -> ssl.SSLContext:
    """The context a listener accepting any of ``secrets`` uses: it presents the certificate
    of the secret the dialer names in SNI (the first one if it names none)."""
    return _server_context(tuple(secrets))


@functools.lru_cache(maxsize=16)
def _server_context(secrets: tuple[bytes, ...]) -> ssl.SSLContext:
    first = _contexts(secrets[0], True)
    if len(secrets) == 1 or user_identity() is not None:
        return first
    by_name = {server_name(s): _contexts(s, True) for s in secrets}
    ctx = _base(True, _identity_for(secrets[0]))
    for secret in secrets[1:]:
        ctx.load_verify_locations(cadata=_identity_for(secret).ca_pem.decode())

    def pick(sslobj: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        chosen = by_name.get(name or "")
        if chosen is not None:
            sslobj.context = chosen

    ctx.sni_callback = pick
    return ctx


def failure(exc: ssl.SSLError) -> str:
    """What a failed TLS handshake means, for an error message or a log line."""
    reason = exc.reason or str(exc)
    if reason in ("CERTIFICATE_VERIFY_FAILED", "TLSV1_ALERT_UNKNOWN_CA"):
        return (
            f"TLS handshake failed ({reason}): the peer holds another job's secret or a "
            "certificate from another CA"
        )
    if reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"):
        return f"TLS handshake failed ({reason}): the peer presented no certificate"
    return f"TLS handshake failed ({reason})"


# -- the socket -------------------------------------------------------------------------------


class SecureSocket:
    """A TLS connection with the socket methods regency's transport uses."""

    __slots__ = ("_lock", "_ssl", "family")

    def __init__(self, sslsock: ssl.SSLSocket) -> None:
        self._ssl = sslsock
        self._lock = threading.Lock()
        self.family = sslsock.family

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self._ssl.fileno()

    def setblocking(self, flag: bool) -> None:
        """Blocking or non-blocking I/O."""
        self._ssl.setblocking(flag)

    def settimeout(self, timeout: float | None) -> None:
        """A timeout for blocking I/O."""
        self._ssl.settimeout(timeout)

    def getpeername(self) -> object:
        """The peer's address."""
        return self._ssl.getpeername()

    def pending(self) -> int:
        """Decrypted bytes already read from the kernel but not yet returned."""
        with self._lock:
            return self._ssl.pending()

    def recv(self, n: int, flags: int = 0) -> bytes:
        """Up to ``n`` bytes (``BlockingIOError`` when none are ready; ``b""`` at the end).

        ``MSG_PEEK`` looks at the raw stream: whether anything (or the end) is there.
        """
        if flags & socket.MSG_PEEK:
            if self.pending():
                return b"\0"
            return socket.socket.recv(self._ssl, n, flags)
        with self._lock:
            try:
                return self._ssl.recv(n)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise BlockingIOError from None

    def recvmsg(
        self, n: int, _ancbufsize: int = 0
    ) -> tuple[bytes, list[tuple[int, int, bytes]], int, None]:
        """:meth:`recv` in ``socket.recvmsg``'s shape (TLS carries no descriptors)."""
        return self.recv(n), [], 0, None

    def recv_into(self, view: memoryview) -> int:
        """Receive into ``view``; ``BlockingIOError`` when nothing is ready, 0 at the end."""
        with self._lock:
            try:
                return self._ssl.recv_into(view)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise BlockingIOError from None

    def sendmsg(self, buffers: Sequence[bytes | bytearray | memoryview]) -> int:
        """Encrypt and send the buffers while the kernel takes them; return how many bytes of
        them went out.

        Small neighbouring buffers go out as one TLS record (one write, one wake-up of the
        reader, instead of one per buffer). The count only ever ends on a buffer boundary, or
        inside a large buffer sent alone: OpenSSL keeps what it already wrote of a record, so
        the caller passes the rest of the same buffers next time and the same pieces form
        again.
        """
        sent = 0
        with self._lock:
            for piece, size in _pieces(buffers):
                try:
                    n = self._ssl.send(piece)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    if sent == 0:
                        raise BlockingIOError from None
                    return sent
                except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:
                    raise BrokenPipeError(f"the peer closed the connection: {exc}") from None
                if n < size:
                    return sent if isinstance(piece, bytes) else sent + n
                sent += n
        return sent

    def send(self, data: bytes) -> int:
        """Send ``data`` (blocking sockets: all of it)."""
        return self.sendmsg([data])

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data`` on a blocking socket."""
        with self._lock:
            try:
                self._ssl.sendall(data)
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as exc:
                raise BrokenPipeError(f"the peer closed the connection: {exc}") from None

    def shutdown(self, how: int) -> None:
        """Shut the TCP connection down (no TLS close_notify: the peer sees the end)."""
        self._ssl.shutdown(how)

    def close(self) -> None:
        """Close the socket."""
        self._ssl.close()


Stream = socket.socket | SecureSocket

_JOIN_BELOW = 64 * 1024


def _pieces(
    buffers: Sequence[bytes | bytearray | memoryview],
) -> list[tuple[bytes | memoryview, int]]:
    """The buffers as pieces to write: runs of small ones joined, large ones alone."""
    pieces: list[tuple[bytes | memoryview, int]] = []
    run: list[memoryview] = []
    run_bytes = 0
    for buf in buffers:
        view = memoryview(buf).cast("B")
        if not view.nbytes:
            continue
        if view.nbytes >= _JOIN_BELOW:
            if run:
                pieces.append((b"".join(run), run_bytes))
                run, run_bytes = [], 0
            pieces.append((view, view.nbytes))
            continue
        if run_bytes + view.nbytes > _JOIN_BELOW:
            pieces.append((b"".join(run), run_bytes))
            run, run_bytes = [], 0
        run.append(view)
        run_bytes += view.nbytes
    if run:
        pieces.append((b"".join(run), run_bytes))
    return pieces


def wrap_client(sock: socket.socket, secret: bytes) -> SecureSocket:
    """Run the TLS handshake as the dialer on a connected blocking socket."""
    sslsock = client_context(secret).wrap_socket(sock, server_hostname=server_name(secret))
    return SecureSocket(sslsock)


def wrap_server(sock: socket.socket, secrets: Sequence[bytes]) -> ssl.SSLSocket:
    """An accepted non-blocking socket as the TLS server side, handshake not yet run (drive it
    with :func:`step_handshake`)."""
    return server_context(secrets).wrap_socket(
        sock, server_side=True, do_handshake_on_connect=False
    )


def step_handshake(sslsock: ssl.SSLSocket) -> bool:
    """Advance a non-blocking server handshake; whether it is complete. Raises ``OSError``
    (``ssl.SSLError``) when it fails."""
    try:
        sslsock.do_handshake()
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    return True
