"""The process-wide runtime singleton (one :class:`ProcRuntime` and its client instance)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regency._runtime.instance import ClientInstance
    from regency._runtime.proc import ProcRuntime

_lock = threading.RLock()
_runtime: ProcRuntime | None = None
_client: ClientInstance | None = None
_shut_down = False
_host_agent: str | None = None
_root: str | None = None


def install(runtime: ProcRuntime, client: ClientInstance, host_agent: str, root: str) -> None:
    """Make ``runtime`` this process's runtime and ``client`` its fallback sender; record the
    addresses of this machine's host agent and of the root controller."""
    global _runtime, _client, _host_agent, _root
    _runtime, _client, _host_agent, _root = runtime, client, host_agent, root


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


def runtime() -> ProcRuntime:
    """This process's runtime, bootstrapping the controller on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    with _lock:
        if _runtime is None:
            if _shut_down:
                raise RuntimeError("regency was shut down in this process and cannot restart")
            from regency._runtime.controller import bootstrap_controller

            bootstrap_controller()
        assert _runtime is not None
        return _runtime


def client() -> ClientInstance:
    """The instance that sends on behalf of code running outside any actor."""
    runtime()
    assert _client is not None
    return _client


def existing() -> ProcRuntime | None:
    """The runtime if it was started, without starting it."""
    return _runtime


def clear(shut_down: bool) -> None:
    """Forget the runtime (after shutdown)."""
    global _runtime, _client, _shut_down
    _runtime, _client = None, None
    _shut_down = _shut_down or shut_down
