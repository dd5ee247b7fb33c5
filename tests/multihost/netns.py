"""Network namespaces as hosts: real addresses, a real bridge, links that can be cut.

``NetnsCluster(n)`` builds ``n`` network namespaces ``rgy-h0`` .. ``rgy-h{n-1}``, each with a
veth pair whose root-side end (``rgy-v{i}``) is a port of the Linux bridge ``rgy-br0``. The
bridge holds ``10.200.0.1/24`` in the root namespace (where the test process, the controller,
lives); host ``i`` holds ``10.200.0.{10+i}/16`` on its ``eth0`` (from host 246 on the count
carries into the third byte: ``10.200.1.0``, ...; see :func:`host_ip`) and has ``lo`` up, so
processes in a namespace can bind ``127.0.0.1`` as well as their host address. Up to
:data:`MAX_HOSTS` hosts (a Linux bridge takes 1,024 ports); the scale benchmark uses 256.

``NetnsCluster(n, isolated=True)`` leaves the bridge without an address in the root namespace
and routes ``10.200.0.0/24`` there as ``unreachable`` (without that, a default route could lead
elsewhere): the hosts still reach each other, but the root namespace (the controller) and the
hosts cannot reach one another at all, as a laptop and the pods of a cluster it reaches only through
``kubectl port-forward`` (``port_forwarder.py`` is that forward).

``cut(host)`` sets the host's root-side veth down: the bridge stops forwarding to and from it
and its ``eth0`` loses carrier, but no socket sees an error. An established TCP connection
across the cut is *silent*: ``send()`` succeeds, nothing arrives, no RST. ``restore(host)``
brings the link back and TCP retransmission delivers what was queued.

Only one ``NetnsCluster`` exists per machine at a time (an exclusive ``flock`` on
``/run/regency-netns.lock``; a second test run waits for the first). Holding the lock, the
cluster first removes whatever an earlier, crashed run left behind (namespaces named
``rgy-h*`` and the processes in them, the bridge, stray veths), and on exit tears everything
down again, also when the test failed. It touches nothing else: only names starting with
``rgy-`` and addresses in ``10.200.0.0/16`` that it creates.

Needs root and ``ip`` (iproute2) with namespace support; ``unavailable_reason()`` says why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

PREFIX = "rgy-"
BRIDGE = f"{PREFIX}br0"
BRIDGE_IP = "10.200.0.1"
SUBNET_BITS = 16
LOCK_PATH = "/run/regency-netns.lock"
MAX_HOSTS = 1000
FIRST_HOST = 10  # host 0's last address byte
ISOLATED_ROUTE = f"10.200.0.0/{SUBNET_BITS}"


def host_ip(index: int) -> str:
    """Host ``index``'s address: ``10.200.0.10`` for host 0, counting on into ``10.200.1.0``."""
    number = FIRST_HOST + index
    return f"10.200.{number // 256}.{number % 256}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` and return the completed process (raises on failure when ``check``)."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or ``None`` when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the tests as root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    add = _ip("netns", "add", probe, check=False)
    if add.returncode != 0:
        return f"`ip netns add` does not work here: {add.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


@dataclass
class Host:
    """One namespace on the bridge: its namespace name, address and root-side link."""

    index: int
    netns: str
    ip: str
    link: str  # the root-side veth end, a bridge port

    def argv(self, cmd: Sequence[str]) -> list[str]:
        """The argv that runs ``cmd`` inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *cmd]


@dataclass
class NetnsCluster:
    """``n`` namespaces on one bridge; a context manager that builds and removes them."""

    n: int = 3
    isolated: bool = False  # no address in the root namespace: it and the hosts cannot talk
    hosts: list[Host] = field(default_factory=list)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    _lock: IO[str] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MAX_HOSTS:
            raise ValueError(f"NetnsCluster takes 1..{MAX_HOSTS} hosts, not {self.n}")

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> NetnsCluster:
        self._lock = open(LOCK_PATH, "a")  # held until __exit__
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # a concurrent run finishes first
        try:
            self.remove_leftovers()
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _build(self) -> None:
        _ip("link", "add", BRIDGE, "type", "bridge")
        if self.isolated:
            _ip("route", "add", "unreachable", ISOLATED_ROUTE)
        else:
            _ip("addr", "add", f"{BRIDGE_IP}/{SUBNET_BITS}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for i in range(self.n):
            host = Host(i, f"{PREFIX}h{i}", host_ip(i), f"{PREFIX}v{i}")
            self.hosts.append(host)
            _ip("netns", "add", host.netns)
            _ip(*f"link add {host.link} type veth peer name eth0 netns {host.netns}".split())
            _ip("link", "set", host.link, "master", BRIDGE)
            _ip("link", "set", host.link, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.ip}/{SUBNET_BITS}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")

    def _teardown(self) -> None:
        try:
            for proc in self._procs:
                _kill_group(proc)
            self._procs.clear()
            self.remove_leftovers()
            self.hosts.clear()
        finally:
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    @staticmethod
    def remove_leftovers() -> None:
        """Remove every ``rgy-`` namespace (killing its processes), the bridge and stray veths.

        Call only while holding the lock (``__enter__`` does).
        """
        listing = _ip("netns", "list", check=False).stdout
        for line in listing.splitlines():
            name = line.split()[0] if line.split() else ""
            if not name.startswith(PREFIX):
                continue
            pids = _ip("netns", "pids", name, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "delete", name, check=False)
        _ip("route", "del", "unreachable", ISOLATED_ROUTE, check=False)
        links = _ip("-o", "link", "show", check=False).stdout
        for name in re.findall(r"^\d+:\s+([^:@\s]+)", links, flags=re.MULTILINE):
            if name.startswith(PREFIX):
                _ip("link", "delete", name, check=False)

    # -- using the hosts -------------------------------------------------------------------

    def host(self, which: int | str | Host) -> Host:
        """A host by index, namespace name or ``Host``."""
        if isinstance(which, Host):
            return which
        if isinstance(which, int):
            return self.hosts[which]
        for host in self.hosts:
            if which in (host.netns, host.ip):
                return host
        raise KeyError(f"no host {which!r}; hosts: {[h.netns for h in self.hosts]}")

    def popen(
        self, which: int | str | Host, cmd: Sequence[str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``cmd`` inside a host's namespace (own session); killed at teardown."""
        kwargs.setdefault("start_new_session", True)
        proc: subprocess.Popen[Any] = subprocess.Popen(self.host(which).argv(cmd), **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self, which: int | str | Host, cmd: Sequence[str], timeout: float = 30, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside a host's namespace to completion; output captured as text."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.host(which).argv(cmd), timeout=timeout, check=False, **kwargs)

    def cut(self, which: int | str | Host) -> None:
        """Cut a host off the network: its bridge port goes down. No socket sees an error."""
        _ip("link", "set", self.host(which).link, "down")

    def restore(self, which: int | str | Host) -> None:
        """Bring a cut host back."""
        _ip("link", "set", self.host(which).link, "up")

    @contextlib.contextmanager
    def cut_off(self, which: int | str | Host) -> Iterator[Host]:
        """``with cluster.cut_off(h):`` the host is unreachable inside the block."""
        host = self.host(which)
        self.cut(host)
        try:
            yield host
        finally:
            self.restore(host)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a process started with its own session, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
