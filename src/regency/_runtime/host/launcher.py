"""How the host agent starts procs: forked from a warm zygote, or cold with ``subprocess``.

Either way the agent learns of each exit at once and gets its wait status: from the zygote's
report (the zygote is the procs' parent) or from a pidfd (for cold-started children).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from regency._runtime.actors.control.bootstrap_command import ProcLaunch, default_bootstrap_cmd
from regency._runtime.host.zygote import MessageReader, send_message
from regency._transport.auth import SECRET_ENV
from regency._transport.io_loop import IOLoop

log = logging.getLogger("regency.host")

ExitHandler = Callable[[int, int], None]  # (pid, wait status)


def _inherited_env() -> dict[str, str]:
    """This process's environment without the job secret (procs hold the controller's)."""
    return {key: value for key, value in os.environ.items() if key != SECRET_ENV}


def _env_for_children() -> dict[str, str]:
    env = _inherited_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class Launcher:
    """Starts procs and reports their exits through ``on_exit(pid, status)`` (I/O thread)."""

    def __init__(self, loop: IOLoop, on_exit: ExitHandler) -> None:
        self._loop = loop
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._zygote: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._spawned: dict[str, threading.Event] = {}
        self._pids: dict[str, int] = {}
        self._zygote_children: set[int] = set()
        self._reader = MessageReader()
        self._closed = False

    # -- the zygote ----------------------------------------------------------------------------

    def start_zygote(self) -> None:
        """Start the template process (idempotent; on failure procs start cold)."""
        with self._lock:
            if self._zygote is not None or self._closed:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._zygote = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "regency._runtime.host.zygote",
                        str(theirs.fileno()),
                        str(os.getpid()),
                    ],
                    pass_fds=(theirs.fileno(),),
                    env=_env_for_children(),
                )
            except OSError as exc:
                log.warning("could not start the zygote (%s); procs will start cold", exc)
                ours.close()
                return
            finally:
                theirs.close()
            self._control = ours
            self._loop.register(ours.fileno(), self._on_control)

    def _on_control(self, _: int) -> None:
        control = self._control
        if control is None:
            return
        try:
            data = control.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._zygote_lost(control)
            return
        for message in self._reader.feed(data):
            if message[0] == "spawned":
                _, token, pid = message
                self._zygote_children.add(pid)
                self._pids[token] = pid
                event = self._spawned.pop(token, None)
                if event is not None:
                    event.set()
            elif message[0] == "exited":
                _, pid, status = message
                self._zygote_children.discard(pid)
                self._on_exit(pid, status)

    def _zygote_lost(self, control: socket.socket) -> None:
        if self._control is not control:
            return  # stopped on purpose (stop_zygote), and maybe replaced since
        self._control = None
        self._loop.unregister(control.fileno())
        control.close()
        self._children_died()

    def _children_died(self) -> None:
        """The zygote's children die with it (PR_SET_PDEATHSIG); report them as killed."""
        for pid in list(self._zygote_children):
            self._on_exit(pid, signal.SIGKILL)
        self._zygote_children.clear()
        for event in self._spawned.values():
            event.set()

    def stop_zygote(self) -> None:
        """Stop the template process now (its children die with it); a later
        :meth:`start_zygote` starts a fresh one."""
        with self._lock:
            zygote, self._zygote = self._zygote, None
            control, self._control = self._control, None
        if control is not None:
            self._loop.unregister(control.fileno())
            with contextlib.suppress(OSError):
                control.shutdown(socket.SHUT_RDWR)  # the zygote exits at the end of its input
            control.close()
            self._children_died()
        if zygote is not None:
            _reap(zygote)

    # -- starting procs ------------------------------------------------------------------------

    def launch(
        self,
        settings: dict[str, Any],
        handoff: socket.socket,
        launch: ProcLaunch | None = None,
        stdio: tuple[int, int] | None = None,
    ) -> int:
        """Start one proc, giving it ``handoff`` (its end of the connection handoff channel);
        return its pid (raises ``OSError`` if it cannot start). A ``launch`` with its own
        command or numactl binding is started by exec, not forked from the zygote. ``stdio``:
        the descriptors to give it as stdout and stderr (default: this process's own)."""
        out, err = stdio if stdio is not None else (1, 2)
        if launch is not None and launch.needs_exec:
            return self._launch_cold(settings, handoff, launch, (out, err))
        control = self._control
        if control is not None:
            token = os.urandom(8).hex()
            event = threading.Event()
            self._spawned[token] = event
            settings = {**settings, "token": token, "env": _inherited_env()}
            try:
                send_message(control, settings, fds=[0, out, err, handoff.fileno()])
            except OSError:
                self._spawned.pop(token, None)
            else:
                if event.wait(30) and token in self._pids:
                    return self._pids.pop(token)
                self._spawned.pop(token, None)
                if self._closed:  # the zygote may have forked it: a cold twin would clash
                    raise OSError("the host agent is shutting down")
                log.warning("the zygote did not fork a proc; starting it cold")
        return self._launch_cold(settings, handoff, None, (out, err))

    def _launch_cold(
        self,
        settings: dict[str, Any],
        handoff: socket.socket,
        launch: ProcLaunch | None,
        stdio: tuple[int, int],
    ) -> int:
        with self._lock:  # close() waits: the loop must outlive the child's registration
            if self._closed:
                raise OSError("the host agent is shutting down")
            return self._launch_cold_locked(settings, handoff, launch, stdio)

    def _launch_cold_locked(
        self,
        settings: dict[str, Any],
        handoff: socket.socket,
        launch: ProcLaunch | None,
        stdio: tuple[int, int],
    ) -> int:
        command = launch.command if launch is not None else None
        if command is None:
            command = default_bootstrap_cmd()
        prefix = launch.numactl_prefix() if launch is not None else []
        read_fd, write_fd = os.pipe()
        try:
            popen = subprocess.Popen(
                [*prefix, *command.argv(str(read_fd))],
                executable=None if prefix else command.program,
                pass_fds=(read_fd, handoff.fileno()),
                env=command.environment(_env_for_children()),
                stdout=stdio[0] if stdio[0] != 1 else None,
                stderr=stdio[1] if stdio[1] != 2 else None,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        with os.fdopen(write_fd, "wb") as pipe:
            pickle.dump({**settings, "handoff_fd": handoff.fileno()}, pipe, protocol=5)
        pidfd = os.pidfd_open(popen.pid)

        def reap(_: int) -> None:
            self._loop.unregister(pidfd)
            os.close(pidfd)
            try:
                _, status = os.waitpid(popen.pid, 0)
            except ChildProcessError:
                status = 0
            popen.returncode = os.waitstatus_to_exitcode(status)
            self._on_exit(popen.pid, status)

        self._loop.register(pidfd, reap)
        return popen.pid

    def close(self) -> None:
        """Stop the zygote (its remaining children die with it)."""
        with self._lock:  # a zygote still starting (the warm-up at start) is stopped too
            self._closed = True
            zygote = self._zygote
            control = self._control
        if control is not None:
            with contextlib.suppress(OSError):
                control.shutdown(socket.SHUT_RDWR)
        if zygote is not None:
            _reap(zygote)


def _reap(zygote: subprocess.Popen[bytes]) -> None:
    """Wait for a zygote told to exit (its input closed); kill it if it does not in 5 s."""
    try:
        zygote.wait(timeout=5)
    except subprocess.TimeoutExpired:
        zygote.kill()
        zygote.wait(timeout=5)
