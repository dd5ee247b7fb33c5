"""Channel addresses: ``unix:@name`` (Linux abstract socket) and ``tcp://host:port``."""

from __future__ import annotations

import socket


class AddressError(ValueError):
    """An address string that regency cannot listen on or dial."""


def _split_tcp(address: str) -> tuple[str, int]:
    rest = address[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise AddressError(f"bad tcp address {address!r}: expected tcp://HOST:PORT")
    return host.strip("[]"), int(port)


def _unix_name(address: str) -> str:
    name = address[len("unix:") :]
    if not name:
        raise AddressError(f"bad unix address {address!r}: expected unix:@NAME or unix:PATH")
    return "\0" + name[1:] if name.startswith("@") else name


def listen(address: str, backlog: int = 512) -> tuple[socket.socket, str]:
    """Bind and listen on ``address``; return the socket and its canonical address."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(_unix_name(address))
        sock.listen(backlog)
        return sock, address
    if address.startswith("tcp://"):
        host, port = _split_tcp(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        bound_port = sock.getsockname()[1]
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        return sock, f"tcp://{shown}:{bound_port}"
    raise AddressError(f"unsupported address {address!r}: use unix:@NAME or tcp://HOST:PORT")


def dial(address: str, timeout: float) -> socket.socket:
    """Connect to ``address`` (blocking, bounded by ``timeout``)."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        target: str | tuple[str, int] = _unix_name(address)
    elif address.startswith("tcp://"):
        host, port = _split_tcp(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = (host, port)
    else:
        raise AddressError(f"unsupported address {address!r}: use unix:@NAME or tcp://HOST:PORT")
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock
