"""What one process knows of the processes it has lost, and who waits to hear of a loss.

The router keeps one :class:`Losses`. It records which peers ended and why (the oldest are
forgotten beyond a bound), which are being stopped on purpose (losing one is its stop, not a
failure), which are this process's own children (a lost connection to one waits for its host
agent's exit report, which says how it ended), and the procs each remote host agent started
(lost with that host). Ports register as watchers of addresses and hear of each loss once;
a port whose handler names the addresses it waits on (``watching``: every call's reply handler)
hears of their loss without registering, which would cost every call a watch and an unwatch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.port_handlers import PortHandler
from regency._runtime.kernel.seam import Timers
from regency._transport.bounded import BoundedDict

# How long a lost connection to a child waits for its host agent's report of how it ended.
EXIT_REPORT_GRACE = 1.0

# The open ports of the process and their handlers (read, never changed, by Losses).
Ports = Mapping[int, PortHandler]
# Told of every death before the watchers are: the transport and the bulk arena forget the peer.
Forget = Callable[[str, str], None]


class Losses:
    """The ended peers of one process, and the ports watching for more."""

    def __init__(self, ports: Ports, forget: Forget, timers: Timers) -> None:
        self._ports = ports
        self._forget = forget
        self._timers = timers
        self._lock = threading.Lock()
        self._watchers: dict[str, set[int]] = {}
        self._dead: dict[str, str] = BoundedDict()
        # Ended processes and why (read-only; the oldest are forgotten beyond a bound). An
        # attribute, not a property: every send reads it.
        self.dead: Mapping[str, str] = self._dead
        self._stopping: dict[str, str] = {}  # proc -> its end's reason: it is stopped on purpose
        self._children: set[str] = set()
        self._host_procs: dict[str, set[str]] = {}  # remote host agent -> procs started there

    def check_alive(self, addr: str) -> None:
        """Raise :class:`PeerLostError` if ``addr`` is known to be gone."""
        reason = self._dead.get(addr)
        if reason is not None:
            raise PeerLostError(f"{addr} is gone: {reason}")

    # -- watchers ------------------------------------------------------------------------------

    def watch(self, port: int, addrs: Sequence[str]) -> None:
        """Tell port ``port``'s handler when any of ``addrs`` is gone (at once if it already is).

        Without a lock (every call watches its destinations): each step is one operation on a
        dict or set, and a loss records the end before it takes the watchers (see
        :meth:`_notify`), so a watch that comes too late to be taken sees the end itself.
        """
        watchers = self._watchers
        for addr in addrs:
            waiting = watchers.get(addr)
            if waiting is None:
                waiting = watchers.setdefault(addr, set())
            waiting.add(port)
        handler = self._ports.get(port)
        if handler is None:
            # Closed meanwhile (its reply already came): it must not linger as a watcher.
            self.unwatch(port, addrs)
            return
        dead = self._dead
        if dead:
            for addr in addrs:
                reason = dead.get(addr)
                if reason is not None:
                    handler.peer_lost(addr, reason)

    def unwatch(self, port: int, addrs: Sequence[str]) -> None:
        """Port ``port`` no longer waits on ``addrs``."""
        watchers = self._watchers
        for addr in addrs:
            waiting = watchers.get(addr)
            if waiting is not None:
                waiting.discard(port)

    # -- children and the hosts that started them ----------------------------------------------

    def add_child(self, addr: str) -> None:
        """A proc this process started: a lost connection to it waits for its exit report."""
        self._children.add(addr)

    def forget_child(self, addr: str) -> None:
        """A proc this process started has ended."""
        self._children.discard(addr)

    def will_account_for(self, addrs: Sequence[str]) -> bool:
        """Whether the end of every one of ``addrs`` is recorded, or will be without anyone
        asking: each is known to be gone, or is a proc this process started (a lost connection
        to one waits for its exit report or its host's loss, then records the end)."""
        dead, children = self._dead, self._children
        return all(addr in dead or addr in children for addr in addrs)

    def started_on(self, agent: str, procs: Sequence[str]) -> bool:
        """Host agent ``agent`` starts ``procs`` for this process; whether it is the first
        time this process starts procs there (the caller then watches the agent)."""
        self._children.update(procs)
        with self._lock:
            on_host = self._host_procs.get(agent)
            first = on_host is None
            if on_host is None:
                on_host = self._host_procs[agent] = set()
            on_host.update(procs)
        return first

    def proc_ended(self, addr: str, reason: str) -> None:
        """A host agent reported that a proc started from here ended."""
        self._children.discard(addr)
        with self._lock:
            for on_host in self._host_procs.values():
                on_host.discard(addr)
        self.mark_dead(addr, reason)

    def host_lost(self, agent: str, reason: str) -> None:
        """The host agent at ``agent`` is gone: every proc started there is lost with it."""
        with self._lock:
            procs = [p for p in self._host_procs.pop(agent, ()) if p not in self._dead]
        why = f"its host {agent} was lost: {reason}"
        # Procs being stopped went as asked, whatever became of their host.
        ends = {proc: self._stopping.pop(proc, why) for proc in procs}
        # Record every loss before telling anyone, so that each account names all the ranks.
        self._dead.update(ends)
        for proc, end in ends.items():
            self._notify(proc, end)

    # -- ends ----------------------------------------------------------------------------------

    def expect_stop(self, addrs: Sequence[str], reason: str) -> None:
        """The procs at ``addrs`` are being stopped on purpose: losing one of them is its stop
        (recorded as ``reason``), not a failure, however long its process takes to exit."""
        for addr in addrs:
            if addr not in self._dead:
                self._stopping[addr] = reason

    def forget_end(self, addr: str) -> None:
        """A new process answers at ``addr`` now: forget how an earlier one there ended."""
        with self._lock:
            self._dead.pop(addr, None)
        self._stopping.pop(addr, None)

    def mark_dead(self, addr: str, reason: str) -> None:
        """Record that the process at ``addr`` is gone and fail everything waiting on it."""
        self._stopping.pop(addr, None)
        if addr in self._dead:
            return
        self._dead[addr] = reason
        self._notify(addr, reason)

    def connection_lost(self, addr: str, reason: str) -> None:
        """The transport lost its connection to ``addr``."""
        stop = self._stopping.get(addr)
        if stop is not None:
            self.mark_dead(addr, stop)
            return
        if addr in self._children:
            # Our host agent will report how the process ended in a moment (it watches the
            # pid); only if the process lives on is the lost connection itself the news.
            self._timers.call_later(
                EXIT_REPORT_GRACE, lambda: self.mark_dead(addr, self._stopping.get(addr, reason))
            )
            return
        self.mark_dead(addr, reason)

    def _notify(self, addr: str, reason: str) -> None:
        self._forget(addr, reason)
        with self._lock:
            waiting = self._watchers.pop(addr, set())
        # A copy: a watch may still add to the set (it then sees the end recorded already).
        for port in list(waiting):
            handler = self._ports.get(port)
            if handler is not None:
                handler.peer_lost(addr, reason)
        # Handlers that say what they wait on. The end is recorded before this copy is taken,
        # and a call opens its port before it looks for recorded ends: either the call sees
        # this end and is refused, or its port is in the copy.
        for handler in list(self._ports.values()):
            watching = getattr(handler, "watching", None)
            if watching is not None and addr in watching:
                handler.peer_lost(addr, reason)
