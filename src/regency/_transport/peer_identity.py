"""Which local user is at the other end of a connection, as the kernel says.

An address does not tell local users apart: every process of every user on this machine
dials from ``127.0.0.1``. The kernel does: for a unix socket it gives the peer's credentials
(``SO_PEERCRED``); for a TCP connection between two sockets of this machine, the peer's socket
is in this network namespace's table (what ``/proc/net/tcp{,6}`` lists) with its owner's uid,
found by the connection's two ends with one ``sock_diag`` netlink query.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Protocol

_UCRED = struct.Struct("3i")

# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2 before its sockid: family, protocol..
_ALL_STATES = 0xFFFFFFFF
_ANY_INTERFACE_NO_COOKIE = struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
# inet_diag_msg after the header: 4 bytes, the 48-byte sockid, expires, rqueue, wqueue, uid,
# inode
_UID_AT = _NLMSG.size + 4 + 48 + 12


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
    """The uid of the process at the other end of unix socket ``sock`` (``None``: unknown)."""
    if sock.family != socket.AF_UNIX:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(creds)
    return int(uid)


def loopback_peer_uid(sock: ConnectedSocket) -> int | None:
    """The uid owning the peer's socket of TCP connection ``sock``, if the peer is on this machine.

    Meant for loopback peers (``127.0.0.0/8``, ``::1``); a peer that dialed one of this
    machine's other addresses is found the same way. ``None`` where the kernel knows no such
    socket in this network namespace (another machine), or the peer closed it already. One
    exact lookup (``sock_diag``, what ``ss`` uses), whatever the number of sockets.
    """
    family = sock.family
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        peer, here = sock.getpeername(), sock.getsockname()
        # The peer's socket: its end is the source, ours the destination.
        sockid = (
            struct.pack("!HH", peer[1], here[1])
            + _packed(family, peer[0])
            + _packed(family, here[0])
            + _ANY_INTERFACE_NO_COOKIE
        )
        request = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
        header = _NLMSG.pack(_NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as netlink:
            netlink.settimeout(1.0)
            netlink.sendto(header + request, (0, 0))
            answer = netlink.recv(4096)
    except (OSError, ValueError):
        return None
    if len(answer) < _UID_AT + 4 or _NLMSG.unpack_from(answer)[1] != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket
    uid, inode = struct.unpack_from("=II", answer, _UID_AT)
    # No inode: the peer closed its socket (a time-wait or orphaned one, whose uid reads 0).
    return int(uid) if inode else None


def _packed(family: int, host: str) -> bytes:
    """An address as ``inet_diag_sockid`` holds it: network order, 16 bytes."""
    return socket.inet_pton(family, host.partition("%")[0]).ljust(16, b"\0")
