"""Free functions of the actor API: where am I, what is my rank, and shutdown."""

from __future__ import annotations

from regency import _hooks
from regency._runtime.actors.base import context as _context
from regency._runtime.actors.base.context import Context
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.meshes.meshes import (
    HostMesh,
    ProcMesh,
    current_context,
    this_host_mesh,
    this_proc_mesh,
)
from regency._runtime.host import controller
from regency._runtime.kernel import state
from regency.shape import Point


def context() -> Context:
    """The running actor's context; outside actors, the root client's (starting it if needed)."""
    return current_context()


def context_or_none() -> Context | None:
    """The current context, or ``None`` where no runtime has started; never starts one.

    The running actor's context, or the root client's once this controller's runtime has
    started: what Monarch's private context variable tells
    (``monarch._src.actor.actor_mesh._context.get()``). Unlike :func:`context`, it does not
    start the runtime, so a library can ask whether it already runs inside one.
    """
    ctx = _context.current_or_none()
    if ctx is not None:
        return ctx
    if state.existing() is None:
        return None
    return Context(_context.client())


def current_rank() -> Point:
    """Return the running actor's position within the slice the message was cast to."""
    return current_context().message_rank


def current_size() -> dict[str, int]:
    """Sizes of the dimensions the current message was cast over."""
    return dict(current_context().message_rank.extent)


def current_actor_name() -> str:
    """The running actor's id as a string."""
    return str(current_context().actor_instance.actor_id)


def this_host() -> HostMesh:
    """The host the current code runs on: a one-host mesh with no dimensions (as in Monarch)."""
    return this_host_mesh()


def this_proc() -> ProcMesh:
    """The current process as a one-proc mesh; actors spawned on it run in this process."""
    return this_proc_mesh()


def shutdown_context(host_timeout: float | None = None) -> Future[None]:
    """Stop every proc and actor this controller started and close its runtime (idempotent).

    ``host_timeout`` (seconds, Monarch's parameter) bounds each proc's stop instead of the
    ``stop_timeout`` setting; with a runtime to shut down it must be finite and non-negative
    (``ValueError``, and nothing is shut down).
    """
    if _context.current_or_none() is None and state.existing() is not None:
        if host_timeout is not None:
            if not isinstance(host_timeout, int | float):
                raise TypeError(f"must be real number, not {type(host_timeout).__name__}")
            host_timeout = float(host_timeout)
            if not 0 <= host_timeout < 2**64:
                raise ValueError(
                    "host_timeout must be finite, non-negative and less than 2**64 seconds"
                )
        controller.shutdown(host_timeout)
    return Future._resolved(None)


def hosts_from_config(name: str) -> HostMesh:
    """The host mesh ``name`` of the project's configuration (see ``regency.job``).

    ``regency.job``'s, offered here as in Monarch's reference: ``regency.job`` is built on this
    package, so a hook reaches it.
    """
    mesh = _hooks.hosts_from_config.load()(name)
    assert isinstance(mesh, HostMesh)
    return mesh
