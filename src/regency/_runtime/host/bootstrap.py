"""A spawned proc's work: read its settings from pipe ``FD``, serve, exit with its parent.

The host agent writes the proc's settings (address, job secret, config, ``sys.path``) to pipe
``FD``. The proc then serves messages until asked to stop, or exits at once if the process that
started it dies.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from regency._config_keys import HEAP_KEEP_BYTES
from regency._runtime.host import heap

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent exits (and exit if it already has)."""
    _die_with_parent(parent_pid)


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def ignore_interrupts() -> None:
    """Let Ctrl-C pass: a terminal sends SIGINT to the controller's whole process group, and
    the controller handles it (its procs and zygote end with it) without tracebacks of theirs.

    A no-op handler rather than ``SIG_IGN``, which programs that an actor starts would inherit.
    """
    signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    """SIGINT in a proc or the zygote: nothing to do (see :func:`ignore_interrupts`)."""


def _read_settings(fd: int) -> dict[str, Any]:
    with os.fdopen(fd, "rb") as pipe:
        settings: dict[str, Any] = pickle.load(pipe)
    return settings


def main() -> None:
    """Run one proc started as ``python -m regency._runtime.bootstrap FD``."""
    settings = _read_settings(int(sys.argv[1]))
    _die_with_parent(settings["parent_pid"])
    serve(settings)


def serve(settings: dict[str, Any]) -> None:
    """Serve as the proc ``settings`` describes until asked to stop."""
    ignore_interrupts()
    sys.path[:] = settings["sys_path"]
    os.chdir(settings["cwd"])
    if settings.get("env") is not None:
        os.environ.clear()
        os.environ.update(settings["env"])

    from regency import config
    from regency._runtime.actors.control.bootstrap_command import apply_cpus

    apply_cpus(settings.get("bind"))
    config.configure(**settings["config"])
    heap.keep_freed_memory(config.value(HEAP_KEEP_BYTES))  # before any thread starts
    if settings.get("log_file") is not None:
        os.environ[LOG_FILE_ENV] = settings["log_file"]
        _forwarded_output()

    from regency._transport import tls

    tls.install(settings.get("tls"))

    from regency._runtime.actors.base import context
    from regency._runtime.actors.control.control import StopProc
    from regency._runtime.actors.execution.instance import ClientInstance
    from regency._runtime.actors.execution.proc_agent import ProcAgent
    from regency._runtime.actors.observe import breakpoints, log_records, tracing
    from regency._runtime.kernel import state, wire
    from regency._runtime.kernel.proc_runtime import ProcRuntime
    from regency._runtime.kernel.service import Service

    handoff = settings.get("handoff_fd")
    runtime = ProcRuntime(
        settings["address"],
        settings["secret"],
        settings["job_id"],
        handoff=socket.socket(fileno=handoff) if handoff is not None else None,
        gateway=settings.get("gateway"),
        reverse=bool(settings.get("reverse")),
        via=settings.get("via"),
        quiet=True,  # a proc: its host agent answers for its liveness (no heartbeats)
    )
    runtime.gateway_ips = list(settings.get("gateway_ips") or ())
    context.install_client(ClientInstance(runtime, is_root=False))
    log_records.prefix_records_with_actor()
    breakpoints.install()
    state.install(runtime, settings["agent"], settings["root"], settings.get("hosts", ()))
    tracing.follow_config()

    stop = threading.Event()
    stopped: list[StopProc] = []
    watch_parent(runtime, settings["parent_pid"])

    def on_stop_proc(request: StopProc) -> None:
        stopped.append(request)
        stop.set()

    # The agent serves before the bootstrap runs, so the bootstrap can use this_proc().
    agent = ProcAgent(runtime, on_stop_proc=on_stop_proc, booting=True)
    runtime.add_service(wire.SERVICE_PROC, Service("regency-proc-agent", agent.handle))
    agent.booted(_run_bootstrap(settings["bootstrap"]))
    stop.wait()
    tracing.finish()
    runtime.close()
    sys.stdout.flush()
    sys.stderr.flush()
    if stopped and stopped[0].exiting:
        os._exit(0)  # see StopProc: the controller exits, so does this proc, at once


LOG_FILE_ENV = "REGENCY_PROC_LOG"  # a forwarded proc's log file, for it and its children


def _forwarded_output() -> None:
    """This proc's stdout and stderr are pipes to its host agent, which forwards each line:
    write every line as it is printed, and give ``logging`` records the actor they came from."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    from regency._runtime.actors.observe.log_records import install_actor_log_handler

    install_actor_log_handler()


def _run_bootstrap(payload: bytes | None) -> str | None:
    """Run the pickled bootstrap callable (awaiting what it returns, if awaitable); return the
    traceback of what it raised, or ``None``."""
    if payload is None:
        return None
    try:
        result = pickle.loads(payload)()
        if hasattr(result, "__await__"):
            import asyncio

            async def wait() -> Any:
                return await result

            asyncio.run(wait())
    except BaseException as exc:
        return "".join(traceback.format_exception(exc))
    return None


def watch_parent(runtime: Any, parent_pid: int) -> None:
    """Exit as soon as the parent process is gone (the orphan rule)."""
    try:
        fd = os.pidfd_open(parent_pid)
    except OSError:
        os._exit(1)

    def parent_gone(_: int) -> None:
        os._exit(1)

    runtime.loop.register(fd, parent_gone)
