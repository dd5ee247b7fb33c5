"""The process-wide runtime singleton (one :class:`ProcRuntime`).

The controller's process starts its runtime on first use, through the controller's boot (the
``boot`` hook of :mod:`regency._hooks`, which the ``regency`` package registers).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from regency import _hooks

if TYPE_CHECKING:
    from regency._runtime.kernel.proc_runtime import ProcRuntime

_lock = threading.RLock()
_runtime: ProcRuntime | None = None
_shut_down = False
_host_agent: str | None = None
_root: str | None = None
_host_mesh: tuple[str, ...] = ()
_adopted_secret: bytes | None = None


def install(
    runtime: ProcRuntime, host_agent: str, root: str, host_mesh: tuple[str, ...] = ()
) -> None:
    """Make ``runtime`` this process's runtime; record the addresses of this machine's host
    agent, of the root controller and of the host agents of the host mesh this process was
    spawned through (none for the controller)."""
    global _runtime, _host_agent, _root, _host_mesh
    _runtime, _host_agent, _root, _host_mesh = runtime, host_agent, root, tuple(host_mesh)


def root_address() -> str:
    """The address of the root controller's process."""
    runtime()
    assert _root is not None
    return _root


def host_agent_address() -> str:
    """The address of the host agent of this process's machine."""
    runtime()
    assert _host_agent is not None
    return _host_agent


def adopt_secret(secret: bytes) -> bool:
    """Have the runtime this process boots hold ``secret`` (another controller's, to join it).

    False if this process already holds another one: its runtime runs, or it adopted another.
    """
    global _adopted_secret
    with _lock:
        if _runtime is not None:
            return _runtime.secret == secret
        if _adopted_secret is None:
            _adopted_secret = secret
        return _adopted_secret == secret


def adopted_secret() -> bytes | None:
    """The secret :func:`adopt_secret` recorded for the runtime to boot with, if any."""
    return _adopted_secret


def host_mesh_agents() -> tuple[str, ...]:
    """The host agents of the host mesh this process was spawned through, in rank order (empty
    in the controller)."""
    return _host_mesh


def runtime() -> ProcRuntime:
    """This process's runtime, bootstrapping the controller on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    with _lock:
        if _runtime is None:
            if _shut_down:
                raise RuntimeError("regency was shut down in this process and cannot restart")
            _hooks.boot.load()()  # must install() the runtime
        assert _runtime is not None
        return _runtime


def existing() -> ProcRuntime | None:
    """The runtime if it was started, without starting it."""
    return _runtime


def clear(shut_down: bool) -> None:
    """Forget the runtime (after shutdown)."""
    global _runtime, _shut_down
    _runtime = None
    _shut_down = _shut_down or shut_down
