"""Who a local peer is, as the kernel says: the uid behind a unix or loopback TCP connection.

A unix socket tells its peer's credentials (``SO_PEERCRED``). A TCP connection over loopback
does not, but its other end is a socket of this machine, and the kernel's socket diagnostics
(``NETLINK_SOCK_DIAG``, what ``ss`` reads; ``/proc/net/tcp`` lists the same but costs a read of
every socket of the machine per lookup) give the uid that owns it, looked up by the peer's
address and port. So on one machine local users are told apart by uid, whichever of the 16
million loopback addresses they dial from.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any, Protocol

_UCRED = struct.Struct("3i")
# NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h): one socket looked up by its
# addresses, as ``ss`` does, without reading every socket of the machine.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
_ESTABLISHED = 1
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_PORTS_ADDRESSES = struct.Struct("!HH16s16s")  # sport, dport, src, dst: network order
_IF_COOKIE = struct.Struct("=III")  # interface, cookie (any): host order
_MSG = struct.Struct("=BBBB48sIIIII")  # family, state, timer, retrans, sockid, ..., uid, inode


class ConnectedSocket(Protocol):
    """What is asked of a connected socket (``socket.socket`` and asyncio's view of one)."""

    @property
    def family(self) -> int:
        """The address family."""

    def getpeername(self) -> Any:
        """The peer's address."""

    def getsockname(self) -> Any:
        """This end's address."""

    def getsockopt(self, level: int, optname: int, buflen: int) -> bytes:
        """A socket option's raw value."""


def unix_peer_uid(sock: ConnectedSocket) -> int | None:
    """The uid of the process at the other end of a unix socket (``None``: unknown, or not a
    unix socket)."""
    if sock.family != socket.AF_UNIX:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(creds)
    return int(uid)


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` is a loopback address (all of 127.0.0.0/8, ``::1``, and 127.x mapped into
    IPv6)."""
    try:
        parsed = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback


def tcp_peer_uid(sock: ConnectedSocket) -> int | None:
    """The uid owning the other end of a TCP connection from this machine's own network
    namespace (``None``: not found, e.g. a peer on another host, one that has closed its end
    already, or not a TCP socket). One exact lookup, whatever the number of sockets."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        peer = sock.getpeername()
        here = sock.getsockname()
    except OSError:
        return None
    peer_ip, here_ip = _plain(str(peer[0])), _plain(str(here[0]))
    if peer_ip is None or here_ip is None or peer_ip.version != here_ip.version:
        return None
    family = socket.AF_INET if peer_ip.version == 4 else socket.AF_INET6
    # The peer's socket: its own end is the peer's address, its remote end ours.
    sockid = _PORTS_ADDRESSES.pack(
        int(peer[1]), int(here[1]), peer_ip.packed.ljust(16, b"\0"), here_ip.packed.ljust(16, b"\0")
    ) + _IF_COOKIE.pack(0, _NO_COOKIE, _NO_COOKIE)
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _ESTABLISHED) + sockid
    header = _NLMSG.pack(_NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(header + request)
            answer = nl.recv(8192)
    except OSError:
        return None
    if len(answer) < _NLMSG.size + _MSG.size:
        return None
    _len, kind, _flags, _seq, _pid = _NLMSG.unpack_from(answer)
    if kind != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket
    _family, state, *_rest, uid, inode = _MSG.unpack_from(answer, _NLMSG.size)
    if state != _ESTABLISHED or inode == 0:
        # Closed by its owner already (an orphan; TIME_WAIT shows uid 0): nobody to count.
        return None
    return int(uid)


def _plain(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``ip`` parsed, an IPv4 address mapped into IPv6 as the IPv4 address it is."""
    try:
        parsed = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed
