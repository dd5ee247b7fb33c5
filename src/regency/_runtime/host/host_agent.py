"""The host agent: starts procs on its machine, watches them, and stops them.

It learns of a child's exit the moment it happens (the zygote's report or a pidfd in the I/O
loop), marks the proc dead in this process's router (failing every call waiting on it) and
records the cause. It also hands each child the TCP connections routed to it through this
process's port (see :mod:`regency._transport.routing`).

The controller's process runs the host agent of its own machine; a worker daemon runs one for
the controller it serves (:class:`HostSession` says which).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from regency import config
from regency._config_keys import STOP_TIMEOUT
from regency._runtime.actors.control.control import (
    HostAgentRequest,
    ProcInfo,
    SpawnProcs,
    StopProc,
    StopProcs,
    WarmZygote,
    unhandled,
)
from regency._runtime.actors.supervision.supervision import stop_reason
from regency._runtime.host.launcher import Launcher
from regency._runtime.host.output import OutputPump, proc_log_dir
from regency._runtime.kernel import gateways, wire
from regency._runtime.kernel.errors import PeerLostError
from regency._runtime.kernel.port_handlers import PeerWatch
from regency._runtime.kernel.proc_runtime import ProcRuntime
from regency._runtime.kernel.refs import PortRef
from regency._transport import address, tls
from regency._transport.address import route_key
from regency._transport.routing import Switchboard, handoff_pair

log = logging.getLogger("regency.host")

_DRAIN_GRACE = 2.0  # seconds an exit report waits at most for the proc's last output lines


@dataclass
class _Child:
    info: ProcInfo
    pid: int
    events: PortRef | None = None  # the spawner's exit-report port (None: this process)
    stopping: str | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    log_path: str | None = None  # its log file, when the output pump reads its stdout/stderr

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def describe_status(status: int) -> str:
    """Human text for a wait status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {name} ({sig})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


@dataclass(frozen=True, slots=True)
class HostSession:
    """What the procs a host agent starts inherit from the controller it serves."""

    job_id: str
    agent: str  # this host agent's address, as the job knows it
    root: str  # the root controller's address
    secret: bytes  # the controller's secret, which every proc of its job holds
    gateway: str | None  # where this machine reaches the controller's unix addresses
    # The controller cannot be dialed from here: it opens reverse connections instead.
    reverse: bool = False


class HostAgent:
    """Serves ``SpawnProcs``/``StopProcs`` requests for the machine it runs on."""

    def __init__(self, runtime: ProcRuntime, session: HostSession | None) -> None:
        self.runtime = runtime
        self.session = session
        self._children: dict[str, _Child] = {}
        self._by_pid: dict[int, _Child] = {}
        self._early_exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._spawners: dict[str, set[str]] = {}
        self.launcher = Launcher(runtime.loop, self._exited)
        # Its procs' requests for reverse connections go on to the controller (worker hosts
        # whose controller cannot be dialed; see regency._transport.reverse).
        self.switchboard = Switchboard(
            runtime.loop.call_later, runtime.loop, runtime.transport.ask_reverse
        )
        runtime.transport.router = self.switchboard
        self._output: OutputPump | None = None  # started with the first forwarded proc

    def handle(self, request: object) -> None:
        """Service entry point (runs on the host agent's own thread)."""
        if not isinstance(request, HostAgentRequest):
            log.warning("host agent got an unknown request %r", type(request).__name__)
            return
        match request:
            case SpawnProcs():
                session = self.session
                for index, info in enumerate(request.procs):
                    if session is None:
                        self._refuse(info, request)
                    else:
                        self._spawn(info, request, session, index)
            case StopProcs():
                threading.Thread(
                    target=self._stop, args=(request,), name="regency-stop", daemon=True
                ).start()
            case WarmZygote():
                self.launcher.start_zygote()
            case _:
                unhandled(request)

    def _refuse(self, info: ProcInfo, request: SpawnProcs) -> None:
        """A spawn request while no controller is attached: report the proc as failed."""
        reason = (
            f"could not start the process: worker {self.runtime.address} serves no controller "
            "(attach to it with attach_to_workers first)"
        )
        log.warning("refused to start %s: no controller is attached", info.addr)
        if request.events is not None:
            with contextlib.suppress(PeerLostError):
                self.runtime.send_port(
                    request.events, 0, 0, [pickle.dumps((info.addr, reason), protocol=5)]
                )

    def _spawn(self, info: ProcInfo, request: SpawnProcs, session: HostSession, index: int) -> None:
        launch = request.launches[index] if request.launches is not None else None
        settings = {
            "address": info.addr,
            "secret": session.secret,
            "job_id": session.job_id,
            "agent": session.agent,
            "root": session.root,
            "hosts": request.hosts,
            "gateway": session.gateway,
            "reverse": session.reverse,
            # Forwarded ports of the hosts the controller reaches that way (its own machine).
            "via": dict(self.runtime.transport.paths.via),
            "parent_pid": os.getpid(),
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "config": request.settings,
            "bootstrap": request.bootstrap,
            "rank": info.rank,
            "bind": launch.bind if launch is not None else None,
            "tls": tls.settings_for_children(),
            # Where the controller's machine is reached from other hosts (RDMA owners listen
            # there too).
            "gateway_ips": gateways.gateway_ips() or list(self.runtime.gateway_ips),
        }
        stdio = None
        log_path = None
        if request.logs is not None:
            try:
                stdio, path = self._pipe_output(info, request, session)
            except OSError as exc:  # e.g. a log directory another user planted: not trusted
                log.warning("not forwarding the output of %s: %s", info.addr, exc)
            else:
                log_path = settings["log_file"] = str(path)
        self.runtime.losses.add_child(info.addr)
        ours, theirs = handoff_pair()
        self.switchboard.register(route_key(info.addr), ours)
        try:
            pid = self.launcher.launch(settings, theirs, launch, stdio)
        except OSError as exc:
            self.switchboard.unregister(route_key(info.addr))
            self.runtime.losses.mark_dead(info.addr, f"could not start the process: {exc}")
            if self._output is not None and stdio is not None:
                self._output.finish(info.addr, lambda: None)
            return
        finally:
            theirs.close()
            for fd in stdio or ():
                os.close(fd)  # the proc has its own copies
        child = _Child(info, pid, request.events, log_path=log_path)
        if request.events is not None:
            self._watch_spawner(request.events.addr, info.addr)
        with self._lock:
            self._children[info.addr] = child
            self._by_pid[pid] = child
            early = self._early_exits.pop(pid, None)
        if early is not None:
            self._exited(pid, early)

    def _pipe_output(
        self, info: ProcInfo, request: SpawnProcs, session: HostSession
    ) -> tuple[tuple[int, int], Path]:
        """Pipes for the proc's stdout and stderr, read by the output pump, which keeps them
        in the proc's log file and forwards their lines to the spawner's log sink."""
        if self._output is None:
            self._output = OutputPump()
        logs = request.logs
        assert logs is not None
        # Hosts on one machine (network namespaces, ProcessJob) share a hostname, not an address.
        host = (
            address.tcp_host(session.agent)
            if address.is_tcp(session.agent)
            else socket.gethostname()
        )
        runtime = self.runtime

        def forward(stream: str, lines: list[str]) -> None:
            with contextlib.suppress(PeerLostError):
                runtime.send_port(
                    logs, info.rank, 0, [pickle.dumps((stream, host, lines), protocol=5)]
                )

        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{request.mesh_name}-{info.rank}")[:80]
        label = f"{name}-{re.sub(r'[^A-Za-z0-9]', '', info.addr)[-12:]}"
        # Each controller served (a worker serves one after another) has its own directory.
        path = proc_log_dir(session.job_id) / f"{label}.log"
        out, err = self._output.attach(info.addr, path, forward)
        return (out, err), path

    def _exited(self, pid: int, status: int) -> None:
        with self._lock:
            child = self._by_pid.pop(pid, None)
            if child is None:  # exited before _spawn recorded it
                self._early_exits[pid] = status
                return
            self._children.pop(child.info.addr, None)
            spawned = self._spawners.get(child.events.addr) if child.events else None
            if spawned is not None:
                spawned.discard(child.info.addr)
        if child.log_path is not None and self._output is not None:
            # Its last lines go out before the news of its exit (bounded, should the pump lag).
            once = _Once(lambda: self._report_exit(child, status))
            self._output.finish(child.info.addr, once)
            self.runtime.loop.call_later(_DRAIN_GRACE, once)
            return
        self._report_exit(child, status)

    def _report_exit(self, child: _Child, status: int) -> None:
        if child.stopping is not None:
            reason = stop_reason(child.stopping)
        else:
            reason = describe_status(status)
            if child.log_path is not None:
                reason += f"; its output is in {child.log_path} on {self.runtime.address}"
        child.exited.set()
        self.switchboard.unregister(route_key(child.info.addr))
        self.runtime.losses.mark_dead(child.info.addr, reason)
        self.runtime.losses.forget_child(child.info.addr)
        if child.events is not None:
            with contextlib.suppress(PeerLostError):
                self.runtime.send_port(
                    child.events, 0, 0, [pickle.dumps((child.info.addr, reason), protocol=5)]
                )

    def _watch_spawner(self, spawner: str, proc: str) -> None:
        """Stop the procs a remote spawner started once that spawner's process is gone."""
        with self._lock:
            spawned = self._spawners.get(spawner)
            first = spawned is None
            if spawned is None:
                spawned = self._spawners[spawner] = set()
            spawned.add(proc)
        if first:
            self.runtime.open_port(PeerWatch(spawner, self.spawner_gone), watch=[spawner])

    def spawner_gone(self, spawner: str, reason: str) -> None:
        """The owner of some procs died: its meshes stop with it."""
        with self._lock:
            orphans = list(self._spawners.pop(spawner, ()))
        if orphans:
            threading.Thread(
                target=self._stop_children,
                args=(orphans, f"their owner {spawner} is gone: {reason}", 1.0),
                name="regency-orphans",
                daemon=True,
            ).start()

    def _stop(self, request: StopProcs) -> None:
        self._stop_children(
            [a for a in request.addrs if a in self._children],
            request.reason,
            config.value(STOP_TIMEOUT),
        )
        with contextlib.suppress(PeerLostError):
            self.runtime.send_port(request.done, request.index, 0, [pickle.dumps(None, protocol=5)])

    def _stop_children(
        self, addrs: list[str], reason: str, timeout: float, exiting: bool = False
    ) -> None:
        waiting = []
        for addr in addrs:
            with self._lock:
                child = self._children.get(addr)
            if child is None:
                continue
            child.stopping = reason
            waiting.append(child)
            self.runtime.losses.expect_stop([addr], stop_reason(reason))
            try:
                self.runtime.send_control(addr, wire.SERVICE_PROC, StopProc(reason, exiting))
            except PeerLostError:
                child.kill()
        deadline = time.monotonic() + timeout
        for child in waiting:
            if not child.exited.wait(max(0.0, deadline - time.monotonic())):
                if not exiting:  # at exit a kill is the budget at work (streams may be closed)
                    log.warning(
                        "proc %s did not stop within %g s; killing it", child.info.addr, timeout
                    )
                child.kill()
                child.exited.wait(5)

    def stop_all(self, reason: str, timeout: float, exiting: bool = False) -> None:
        """Stop every child (politely, then by force after ``timeout``); ``exiting``: see
        :class:`StopProc`."""
        with self._lock:
            addrs = list(self._children)
        self._stop_children(addrs, reason, timeout, exiting)

    def shutdown(self, timeout: float, exiting: bool = False) -> None:
        """Stop every child and the zygote; ``exiting``: the controller's process is exiting."""
        self.stop_all("controller shutting down", timeout, exiting)
        self.launcher.close()
        self.switchboard.close()
        if self._output is not None:
            self._output.close()


class _Once:
    """A callable that runs ``fn`` the first time it is called, from whichever thread."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()
