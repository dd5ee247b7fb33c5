"""Which machine and process namespace this process is in, and whether another process lives.

Two processes can attach to each other's memory when they run on the same kernel (the same boot
id) in the same PID namespace; they can reach each other's abstract Unix sockets when they also
share a network namespace. A process is named by its pid *and* its start time, so a reused pid
is never mistaken for the original process.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import NamedTuple


class HostIdentity(NamedTuple):
    """The kernel and namespaces a process runs in."""

    boot_id: str
    pid_ns: str
    net_ns: str
    hostname: str

    def shares_memory_with(self, other: HostIdentity) -> bool:
        """Whether processes here and there can use cross-memory attach and shared memory."""
        return self.boot_id == other.boot_id and self.pid_ns == other.pid_ns

    def shares_unix_sockets_with(self, other: HostIdentity) -> bool:
        """Whether abstract Unix sockets bound there can be dialed from here."""
        return self.boot_id == other.boot_id and self.net_ns == other.net_ns


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def this_host() -> HostIdentity:
    """The :class:`HostIdentity` of this process (unknown fields are empty)."""
    boot = _read("/proc/sys/kernel/random/boot_id") or f"unknown-{os.urandom(8).hex()}"
    return HostIdentity(
        boot, _link("/proc/self/ns/pid"), _link("/proc/self/ns/net"), socket.gethostname()
    )


def start_time(pid: int) -> int | None:
    """The start time (clock ticks after boot) of a running process, ``None`` if it is gone.

    A zombie counts as gone: its memory is already released.
    """
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_running(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` is still running."""
    return start_time(pid) == started
