"""The proc-control protocol: requests to host agents about procs (start, stop, shut down) and
the port handlers that count their answers, and what a proc mesh records about each proc."""

from __future__ import annotations

import os
import pickle
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from regency import config
from regency._config_keys import ENABLE_LOG_FORWARDING
from regency._runtime.actors.base.errors import ActorError
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.control.bootstrap_command import ProcLaunch
from regency._runtime.actors.control.control import ProcInfo, ShutdownHost, SpawnProcs, StopProcs
from regency._runtime.actors.supervision.supervision import stop_reason
from regency._runtime.kernel import state, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.pending import Pending
from regency._runtime.kernel.refs import Part, PortRef
from regency._transport import address

_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def new_proc_address(agent: str, job_id: str, mesh_name: str, tag: str = "") -> str:
    """A fresh address for a proc of mesh ``mesh_name`` that host agent ``agent`` will start:
    on this machine a unix address, on a worker host one behind the worker's TCP port."""
    mesh = _NAME_SAFE.sub("_", mesh_name)[:64]
    return address.behind(agent, f"regency-{job_id}-{mesh}-{tag}{os.urandom(6).hex()}")


class Countdown:
    """Port handler completing a pending once ``expected`` messages have arrived."""

    def __init__(self, expected: int, watch: Sequence[str], what: str) -> None:
        self.pending = Pending()
        self._left = expected
        self._errors: list[str] = []
        self._watch = list(watch)
        self._what = what
        self.port = -1
        if expected == 0:
            self.pending.set_result(None)

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        error = pickle.loads(parts[0]) if parts else None
        if error is not None:
            self._errors.append(f"rank {rank}: {error}")
        self._left -= 1
        if self._left == 0:
            self._finish()

    def _finish(self) -> None:
        rt = state.runtime()
        rt.close_port(self.port, self._watch)
        if self._errors:
            self.pending.set_exception(
                ActorError(None, f"{self._what} failed", "\n".join(self._errors))
            )
        else:
            self.pending.set_result(None)

    def peer_lost(self, addr: str, reason: str) -> None:
        self._errors.append(f"{addr}: {reason}")
        self._left = 0
        self._finish()


def open_countdown(expected: int, watch: Sequence[str], what: str) -> tuple[Countdown, PortRef]:
    handler = Countdown(expected, watch, what)
    ref = state.runtime().open_port(handler, watch=watch)
    handler.port = ref.port
    return handler, ref


@dataclass(frozen=True, slots=True)
class ProcRecipe:
    """How a proc mesh's procs were started, to start more like them (restarts)."""

    bootstrap: bytes | None
    mesh_name: str
    settings: dict[str, object]
    launches: tuple[ProcLaunch | None, ...] | None = None  # by rank
    logs: PortRef | None = None  # the mesh's log sink, where forwarded output goes
    hosts: tuple[str, ...] = ()  # the host agents of the host mesh they were spawned through


def start_procs(agent: str, infos: Sequence[ProcInfo], recipe: ProcRecipe) -> None:
    """Ask the host agent at ``agent`` to start ``infos``; their exits are reported back here."""
    rt = state.runtime()
    # The controller's own host agent marks its children dead in this very process.
    events = rt.exit_reports(agent, [i.addr for i in infos]) if agent != rt.address else None
    launches = (
        tuple(recipe.launches[i.rank] for i in infos) if recipe.launches is not None else None
    )
    # Procs on this machine share the controller's terminal unless forwarding is asked for;
    # on another host their output would otherwise end in the worker's log.
    forward = agent != rt.address or config.value(ENABLE_LOG_FORWARDING)
    rt.send_control(
        agent,
        wire.SERVICE_HOST,
        SpawnProcs(
            tuple(infos),
            recipe.bootstrap,
            recipe.mesh_name,
            events,
            recipe.settings,
            launches,
            recipe.logs if forward else None,
            recipe.hosts,
        ),
    )


class _HostsGone:
    """Port handler completing once every worker asked to shut down is gone (or refused)."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.pending = Pending()
        self._left = set(agents)
        self._errors: list[str] = []
        self.port = -1
        if not agents:
            self.pending.set_result(None)

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        agent, error = pickle.loads(parts[0])
        self._errors.append(f"{agent}: {error}")
        self._gone(agent)

    def peer_lost(self, addr: str, reason: str) -> None:
        self._gone(addr)

    def _gone(self, agent: str) -> None:
        if agent not in self._left:
            return
        self._left.discard(agent)
        if self._left:
            return
        state.runtime().close_port(self.port)
        if self._errors:
            self.pending.set_exception(
                ActorError(None, "shutting down the host mesh failed", "\n".join(self._errors))
            )
        else:
            self.pending.set_result(None)


def shutdown_hosts(agents: Sequence[str]) -> Future[None]:
    """Ask the worker daemons at ``agents`` to stop every proc and exit; done once all are gone."""
    rt = state.runtime()
    handler = _HostsGone(agents)
    ref = rt.open_port(handler)
    handler.port = ref.port
    for agent in agents:
        try:
            rt.send_control(agent, wire.SERVICE_HOST, ShutdownHost(rt.address, ref))
        except PeerLostError:
            handler.peer_lost(agent, "unreachable")
    rt.losses.watch(ref.port, agents)
    return Future._from_pending(handler.pending)


class StopCountdown:
    """Port handler completing a pending once every host agent asked to stop procs answered,
    or was lost: a lost host's procs are gone with it (an agent that dropped its connection
    to this process, e.g. because it took it for gone, will never answer)."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.pending = Pending()
        self.agents = list(agents)
        self._left = set(range(len(self.agents)))
        self._lock = threading.Lock()
        self.port = -1
        if not self._left:
            self.pending.set_result(None)

    def deliver(self, rank: int, flags: int, parts: Sequence[Part]) -> None:
        self._done(rank)

    def peer_lost(self, addr: str, reason: str) -> None:
        for index, agent in enumerate(self.agents):
            if agent == addr:
                self._done(index)

    def _done(self, index: int) -> None:
        with self._lock:
            if index not in self._left:
                return
            self._left.discard(index)
            if self._left:
                return
        state.runtime().close_port(self.port, self.agents)
        self.pending.set_result(None)


def stop_procs(infos: Sequence[ProcInfo], reason: str) -> Future[None]:
    """Stop procs through their host agents (politely, then by force)."""
    rt = state.runtime()
    by_agent: dict[str, list[str]] = {}
    for info in infos:
        by_agent.setdefault(info.agent, []).append(info.addr)
    tracker = StopCountdown(list(by_agent))
    port = rt.open_port(tracker, watch=tracker.agents)
    tracker.port = port.port
    rt.losses.expect_stop([info.addr for info in infos], stop_reason(reason))
    for index, (agent, addrs) in enumerate(by_agent.items()):
        try:
            rt.send_control(agent, wire.SERVICE_HOST, StopProcs(tuple(addrs), reason, port, index))
        except PeerLostError:
            tracker.peer_lost(agent, "lost")
    return Future._from_pending(tracker.pending)


def unique(addrs: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(addrs))


def after(first: Future[None], then: Callable[[], Future[None]]) -> Future[None]:
    """A future for ``then()``'s outcome, started once ``first`` completes."""
    pending = Pending()

    def chain(_: Pending) -> None:
        second = then()
        second._pending.add_done_callback(
            lambda p: (
                pending.set_exception(p.error())  # type: ignore[arg-type]
                if p.error() is not None
                else pending.set_result(None)
            )
        )

    first._pending.add_done_callback(chain)
    return Future._from_pending(pending)
