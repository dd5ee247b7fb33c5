"""Which local user is at the other end of a connection, as the kernel says.

An address does not tell local users apart: every process of every user on this machine
dials from ``127.0.0.1``. The kernel does: for a unix socket it gives the peer's credentials
(``SO_PEERCRED``); for a TCP connection between two sockets of this machine, the peer's socket
is in this network namespace's table (``/proc/net/tcp``, ``/proc/net/tcp6``) with its owner's
uid, found by the connection's two ends.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys
from typing import Any, Protocol

_UCRED = struct.Struct("3i")
_TCP4, _TCP6 = "/proc/self/net/tcp", "/proc/self/net/tcp6"


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
    machine's other addresses is found the same way. ``None`` where the peer's socket is not in
    this network namespace's table: another machine, or a peer that already closed.
    """
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        peer, here = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    for path, key in _keys(str(peer[0]), int(peer[1]), str(here[0]), int(here[1])):
        try:
            with open(path, "rb") as table:
                next(table, None)  # the header
                for line in table:
                    fields = line.split()
                    if len(fields) > 7 and (fields[1], fields[2]) == key:
                        return int(fields[7])
        except OSError:
            continue
    return None


def _keys(
    peer: str, peer_port: int, here: str, here_port: int
) -> list[tuple[str, tuple[bytes, bytes]]]:
    """The rows that would hold the peer's socket: its end first, then ours, per table."""
    peer_ip = ipaddress.ip_address(peer.partition("%")[0])
    here_ip = ipaddress.ip_address(here.partition("%")[0])
    keys: list[tuple[str, tuple[bytes, bytes]]] = []
    mapped = [getattr(ip, "ipv4_mapped", None) for ip in (peer_ip, here_ip)]
    if isinstance(mapped[0], ipaddress.IPv4Address) and isinstance(
        mapped[1], ipaddress.IPv4Address
    ):  # a dual-stack listener: the peer may well have dialed with an IPv4 socket
        keys.append((_TCP4, _row(mapped[0], peer_port, mapped[1], here_port)))
    table = _TCP4 if peer_ip.version == 4 else _TCP6
    keys.append((table, _row(peer_ip, peer_port, here_ip, here_port)))
    return keys


def _row(
    peer: ipaddress.IPv4Address | ipaddress.IPv6Address,
    peer_port: int,
    here: ipaddress.IPv4Address | ipaddress.IPv6Address,
    here_port: int,
) -> tuple[bytes, bytes]:
    return (_hex(peer, peer_port), _hex(here, here_port))


def _hex(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> bytes:
    """An address as the kernel's table prints it: 32-bit words in host order, then the port."""
    raw = ip.packed
    words = "".join(
        f"{int.from_bytes(raw[i : i + 4], sys.byteorder):08X}" for i in range(0, len(raw), 4)
    )
    return f"{words}:{port:04X}".encode()
