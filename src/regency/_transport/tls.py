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

The certificates are made in :mod:`regency._transport.certs`; :class:`SecureSocket`
(:mod:`regency._transport.secure_socket`) wraps an ``ssl.SSLSocket`` with the methods the
connection, the frame reader and the handshakes use.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from regency._transport.certs import (
    Identity,
    TLSSetupError,
    derived_identity,
    fingerprint,
    generate_ca_and_leaf,
    leaf_signed_by,
)
from regency._transport.secure_socket import SecureSocket, Stream

# This module is the TLS surface for the transport and the tests: it re-exports the
# certificates (certs.py) and the socket (secure_socket.py).
__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "ENABLE_ENV",
    "KEY_ENV",
    "Identity",
    "SecureSocket",
    "Stream",
    "TLSSetupError",
    "applies",
    "client_context",
    "derived_identity",
    "enabled",
    "failure",
    "force_enabled",
    "generate_ca_and_leaf",
    "identity_from",
    "install",
    "leaf_signed_by",
    "server_context",
    "server_name",
    "set_user_identity",
    "settings_for_children",
    "step_handshake",
    "user_identity",
    "wrap_client",
    "wrap_server",
]

ENABLE_ENV = "REGENCY_TLS"
CA_ENV = "REGENCY_TLS_CA"
CERT_ENV = "REGENCY_TLS_CERT"
KEY_ENV = "REGENCY_TLS_KEY"
_OFF = {"0", "off", "false", "no"}
_EVERYWHERE = {"all", "loopback", "everywhere"}
_SNI_SUFFIX = ".regency"
_USER_SNI = "user" + _SNI_SUFFIX


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


def server_name(secret: bytes) -> str:
    """What a dialer proving ``secret`` names in SNI: which CA it trusts (not secret itself)."""
    if user_identity() is not None:
        return _USER_SNI
    return f"j{fingerprint(secret)}{_SNI_SUFFIX}"


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
