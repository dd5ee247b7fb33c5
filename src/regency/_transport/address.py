"""Channel addresses.

``unix:@name`` (Linux abstract socket) or ``unix:PATH``: a process on this machine.
``tcp://host:port``: a process listening on TCP (a worker daemon, or a controller's gateway).
``tcp://host:port/NAME``: process ``NAME`` behind the host listening at ``host:port``. The dialer
connects there and names ``NAME`` in a route preamble; the host hands the connection over to
that process (see :mod:`regency._transport.routing`), so one port serves a whole machine.
"""

from __future__ import annotations

import fcntl
import math
import socket
import struct

from regency._errors import RegencyError

_SIOCGIFADDR = 0x8915


class AddressError(RegencyError, ValueError):
    """An address string that regency cannot listen on or dial."""


def _split_tcp(address: str) -> tuple[str, int]:
    rest = address[len("tcp://") :].partition("/")[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise AddressError(f"bad tcp address {address!r}: expected tcp://HOST:PORT")
    return host.strip("[]"), int(port)


def _unix_name(address: str) -> str:
    name = address[len("unix:") :]
    if not name:
        raise AddressError(f"bad unix address {address!r}: expected unix:@NAME or unix:PATH")
    return "\0" + name[1:] if name.startswith("@") else name


def is_tcp(address: str) -> bool:
    """Whether ``address`` is reached over TCP."""
    return address.startswith("tcp://")


def host_port(address: str) -> str:
    """The ``tcp://host:port`` part of a TCP address (without any ``/NAME``)."""
    return "tcp://" + address[len("tcp://") :].partition("/")[0]


def tcp_host(address: str) -> str:
    """The host (name or IP, without brackets) of a TCP address."""
    return _split_tcp(address)[0]


def tcp_port(address: str) -> int:
    """The port of a TCP address."""
    return _split_tcp(address)[1]


def route_key(address: str) -> str:
    """What a dialer names in its route preamble to reach ``address`` through its host.

    ``""`` for the host itself (``tcp://host:port``), ``NAME`` for ``tcp://host:port/NAME`` and
    the whole address for a ``unix:`` address reached through a gateway.
    """
    if is_tcp(address):
        return address[len("tcp://") :].partition("/")[2]
    return address


def behind(host: str, name: str) -> str:
    """The address of process ``name`` served by the host at ``host`` (``tcp://``) or on this
    machine (``unix:``)."""
    if is_tcp(host):
        return f"{host_port(host)}/{name}"
    return f"unix:@{name}"


def listen(address: str, backlog: int = 512) -> tuple[socket.socket, str]:
    """Bind and listen on ``address``; return the socket and its canonical address."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(_unix_name(address))
        sock.listen(backlog)
        return sock, address
    if is_tcp(address):
        if route_key(address):
            raise AddressError(f"cannot listen on {address!r}: its host listens for it")
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
    """Connect to ``address`` (blocking, bounded by ``timeout``); for ``tcp://host:port/NAME``
    this connects to ``host:port``."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        target: str | tuple[str, int] = _unix_name(address)
    elif is_tcp(address):
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


def tune_tcp(sock: socket.socket, interval: float, timeout: float) -> None:
    """Have the kernel notice a silent TCP peer: a keepalive probe once the connection was
    quiet for ``timeout`` seconds, then every ``interval`` while unanswered, and
    ``TCP_USER_TIMEOUT`` so that unanswered probes or unacknowledged data fail the connection
    after ``timeout``: within about ``timeout + interval`` of a cut (whole seconds), and one
    probe per ``timeout`` on a healthy idle connection."""
    if sock.family == socket.AF_UNIX:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    every = max(1, math.ceil(interval))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, math.ceil(timeout)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, every)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, math.ceil(timeout / every)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, int(timeout * 1000)))


def local_ip_toward(address: str) -> str:
    """The IP of this machine's interface that routes to the host of TCP ``address``."""
    host, port = _split_tcp(address)
    info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    probe = socket.socket(info[0], socket.SOCK_DGRAM)
    try:
        probe.connect(info[4])  # a UDP "connect" only consults the routing table
        return str(probe.getsockname()[0])
    finally:
        probe.close()


def tcp_address(ip: str, port: int) -> str:
    """``tcp://ip:port``, with brackets around an IPv6 address."""
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def _interface_ips() -> list[str]:
    """The IPv4 addresses of this network namespace's interfaces other than loopback."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
            ip = socket.inet_ntoa(answer[20:24])
            if not ip.startswith("127."):
                found.append(ip)
    return found


def primary_ip() -> str:
    """This machine's main IP address: the one its default route uses, else the first
    interface's (a host with no default route), else loopback."""
    try:
        # TEST-NET-1: only the default route (or a route to this very network) leads there.
        return local_ip_toward("tcp://192.0.2.1:9")
    except OSError:
        pass
    ips = _interface_ips()
    return ips[0] if ips else "127.0.0.1"
