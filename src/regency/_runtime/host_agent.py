"""The host agent: starts procs on its machine, watches them, and stops them.

It learns of a child's exit the moment it happens (the zygote's report or a pidfd in the I/O
loop), marks the proc dead in this process's router (failing every call waiting on it) and
records the cause.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from regency import config
from regency._runtime import state, wire
from regency._runtime.launcher import Launcher
from regency._runtime.proc import ProcRuntime
from regency._runtime.procs import ProcInfo, SpawnProcs, StopProcs
from regency._transport.transport import PeerUnreachableError

log = logging.getLogger("regency.host")


@dataclass
class _Child:
    info: ProcInfo
    pid: int
    stopping: str | None = None
    exited: threading.Event = field(default_factory=threading.Event)

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


class HostAgent:
    """Serves ``SpawnProcs``/``StopProcs`` requests for the machine it runs on."""

    def __init__(self, runtime: ProcRuntime) -> None:
        self.runtime = runtime
        self._children: dict[str, _Child] = {}
        self._by_pid: dict[int, _Child] = {}
        self._early_exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self.launcher = Launcher(runtime.loop, self._exited)

    def handle(self, request: Any) -> None:
        """Service entry point (runs on the host agent's own thread)."""
        if isinstance(request, SpawnProcs):
            for info in request.procs:
                self._spawn(info, request)
        elif isinstance(request, StopProcs):
            threading.Thread(
                target=self._stop, args=(request,), name="regency-stop", daemon=True
            ).start()
        elif request == "warm":
            self.launcher.start_zygote()
        else:
            log.warning("host agent got an unknown request %r", type(request).__name__)

    def _spawn(self, info: ProcInfo, request: SpawnProcs) -> None:
        settings = {
            "address": info.addr,
            "secret": self.runtime.secret,
            "job_id": self.runtime.job_id,
            "agent": self.runtime.address,
            "root": state.root_address(),
            "parent_pid": os.getpid(),
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "config": request.settings,
            "bootstrap": request.bootstrap,
            "rank": info.rank,
        }
        self.runtime.local_children.add(info.addr)
        try:
            pid = self.launcher.launch(settings)
        except OSError as exc:
            self.runtime.mark_dead(info.addr, f"could not start the process: {exc}")
            return
        child = _Child(info, pid)
        with self._lock:
            self._children[info.addr] = child
            self._by_pid[pid] = child
            early = self._early_exits.pop(pid, None)
        if early is not None:
            self._exited(pid, early)

    def _exited(self, pid: int, status: int) -> None:
        with self._lock:
            child = self._by_pid.pop(pid, None)
            if child is None:  # exited before _spawn recorded it
                self._early_exits[pid] = status
                return
            self._children.pop(child.info.addr, None)
        reason = describe_status(status)
        if child.stopping is not None:
            reason = f"stopped ({child.stopping})"
        child.exited.set()
        self.runtime.mark_dead(child.info.addr, f"the process {reason}")
        self.runtime.local_children.discard(child.info.addr)

    def _stop(self, request: StopProcs) -> None:
        self._stop_children(
            [a for a in request.addrs if a in self._children],
            request.reason,
            float(config.get("stop_timeout")),
        )
        with contextlib.suppress(PeerUnreachableError):
            self.runtime.send_port(request.done, 0, 0, [pickle.dumps(None, protocol=5)])

    def _stop_children(self, addrs: list[str], reason: str, timeout: float) -> None:
        waiting = []
        for addr in addrs:
            with self._lock:
                child = self._children.get(addr)
            if child is None:
                continue
            child.stopping = reason
            waiting.append(child)
            try:
                self.runtime.send_control(addr, wire.SERVICE_PROC, ("stop_proc", reason))
            except PeerUnreachableError:
                child.kill()
        deadline = time.monotonic() + timeout
        for child in waiting:
            if not child.exited.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "proc %s did not stop within %.0f s; killing it", child.info.addr, timeout
                )
                child.kill()
                child.exited.wait(5)

    def shutdown(self, timeout: float) -> None:
        """Stop every child (politely, then by force after ``timeout``) and the zygote."""
        with self._lock:
            addrs = list(self._children)
        self._stop_children(addrs, "controller shutting down", timeout)
        self.launcher.close()
