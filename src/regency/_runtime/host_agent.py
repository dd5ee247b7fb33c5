"""The host agent: starts procs on its machine, watches them, and stops them.

It learns of a child's exit the moment it happens (a pidfd in the I/O loop), marks the proc dead
in this process's router (failing every call waiting on it) and tells the requester.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from regency import config
from regency._runtime import state, wire
from regency._runtime.proc import ProcRuntime
from regency._runtime.procs import ProcInfo, SpawnProcs, StopProcs
from regency._transport.transport import PeerUnreachableError

log = logging.getLogger("regency.host")


@dataclass
class _Child:
    info: ProcInfo
    popen: subprocess.Popen[bytes]
    pidfd: int
    stopping: str | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    reason: str = ""


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
        self._lock = threading.Lock()

    def handle(self, request: Any) -> None:
        """Service entry point (runs on the host agent's own thread)."""
        if isinstance(request, SpawnProcs):
            for info in request.procs:
                self._spawn(info, request)
        elif isinstance(request, StopProcs):
            threading.Thread(
                target=self._stop, args=(request,), name="regency-stop", daemon=True
            ).start()
        else:
            log.warning("host agent got an unknown request %r", type(request).__name__)

    def _spawn(self, info: ProcInfo, request: SpawnProcs) -> None:
        read_fd, write_fd = os.pipe()
        boot = {
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
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-m", "regency._runtime.bootstrap", str(read_fd)],
                pass_fds=(read_fd,),
                env=env,
                close_fds=True,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            self.runtime.mark_dead(info.addr, f"could not start the process: {exc}")
            return
        os.close(read_fd)
        with os.fdopen(write_fd, "wb") as pipe:
            pickle.dump(boot, pipe, protocol=5)
        self.runtime.local_children.add(info.addr)
        pidfd = os.pidfd_open(popen.pid)
        child = _Child(info, popen, pidfd)
        with self._lock:
            self._children[info.addr] = child
        self.runtime.loop.register(pidfd, lambda _: self._reap(child))

    def _reap(self, child: _Child) -> None:
        self.runtime.loop.unregister(child.pidfd)
        os.close(child.pidfd)
        try:
            _, status = os.waitpid(child.popen.pid, 0)
            child.popen.returncode = os.waitstatus_to_exitcode(status)
            reason = describe_status(status)
        except ChildProcessError:
            reason = "exited"
        if child.stopping is not None:
            reason = f"stopped ({child.stopping})"
        child.reason = reason
        with self._lock:
            self._children.pop(child.info.addr, None)
        child.exited.set()
        self.runtime.mark_dead(child.info.addr, f"the process {reason}")
        self.runtime.local_children.discard(child.info.addr)

    def _stop(self, request: StopProcs) -> None:
        timeout = float(config.get("stop_timeout"))
        waiting = []
        for addr in request.addrs:
            with self._lock:
                child = self._children.get(addr)
            if child is None:
                continue
            child.stopping = request.reason
            waiting.append(child)
            try:
                self.runtime.send_control(addr, wire.SERVICE_PROC, ("stop_proc", request.reason))
            except PeerUnreachableError:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()
        deadline = time.monotonic() + timeout
        for child in waiting:
            if not child.exited.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "proc %s did not stop within %.0f s; killing it", child.info.addr, timeout
                )
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()
                child.exited.wait(5)
        with contextlib.suppress(PeerUnreachableError):
            self.runtime.send_port(request.done, 0, 0, [pickle.dumps(None, protocol=5)])

    def shutdown(self, timeout: float) -> None:
        """Stop every child: ask politely, then kill what is left after ``timeout``."""
        with self._lock:
            children = list(self._children.values())
        for child in children:
            child.stopping = "controller shutting down"
            try:
                self.runtime.send_control(
                    child.info.addr, wire.SERVICE_PROC, ("stop_proc", "controller shutting down")
                )
            except PeerUnreachableError:
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()
        deadline = time.monotonic() + timeout
        for child in children:
            if not child.exited.wait(max(0.0, deadline - time.monotonic())):
                with contextlib.suppress(ProcessLookupError):
                    child.popen.kill()
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=5)
