"""Regency's actor API: Monarch's ``monarch.actor``, in pure Python.

Define actors, spawn them on meshes of processes, and message them::

    from regency.actor import Actor, endpoint, this_host

    class Trainer(Actor):
        @endpoint
        def train(self, step: int) -> float:
            return 0.5 * step

    procs = this_host().spawn_procs(per_host={"gpus": 8})
    trainers = procs.spawn("trainers", Trainer)
    print(trainers.train.call(step=0).get())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from regency import _public
from regency._config_keys import ChannelTransport
from regency._errors import RegencyError
from regency._runtime.actors.base.context import Context
from regency._runtime.actors.base.endpoint_def import Actor, concurrent_endpoint, endpoint
from regency._runtime.actors.base.errors import ActorError, SupervisionError
from regency._runtime.actors.base.future import Future
from regency._runtime.actors.base.ports import Channel, Port, PortReceiver
from regency._runtime.actors.base.value_mesh import ValueMesh
from regency._runtime.actors.control.bootstrap_command import (
    BootstrapCommand,
    default_bootstrap_cmd,
)
from regency._runtime.actors.meshes.accumulator import Accumulator
from regency._runtime.actors.meshes.actor_mesh import ActorMesh
from regency._runtime.actors.meshes.endpoint import Endpoint, as_endpoint, send
from regency._runtime.actors.meshes.meshes import HostMesh, ProcMesh
from regency._runtime.actors.meshes.singletons import get_or_spawn_controller
from regency._runtime.actors.supervision.supervision import (
    MeshFailure,
    MeshRestarted,
    RestartPolicy,
    UndeliverableMessageEnvelope,
    default_unhandled_fault_hook,
)
from regency._runtime.kernel.ids import ProcId, Uid
from regency.actor import config
from regency.actor._extras import (
    attach,
    debug_controller,
    enable_transport,
    returns_future,
)
from regency.actor._functions import (
    context,
    context_or_none,
    current_actor_name,
    current_rank,
    current_size,
    hosts_from_config,
    shutdown_context,
    this_host,
    this_proc,
)
from regency.observe.telemetry import get_meter, span, traced
from regency.shape import Extent, Point

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "BootstrapCommand",
    "Channel",
    "ChannelTransport",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "MeshRestarted",
    "Point",
    "Port",
    "PortReceiver",
    "ProcId",
    "ProcMesh",
    "RegencyError",
    "RestartPolicy",
    "SupervisionError",
    "Uid",
    "UndeliverableMessageEnvelope",
    "ValueMesh",
    "as_endpoint",
    "attach",
    "attach_to_workers",
    "concurrent_endpoint",
    "config",
    "context",
    "context_or_none",
    "current_actor_name",
    "current_rank",
    "current_size",
    "debug_controller",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_meter",
    "get_or_spawn_controller",
    "hosts_from_config",
    "returns_future",
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "send",
    "shutdown_context",
    "span",
    "start_worker_loop_forever",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]

unhandled_fault_hook: Callable[[MeshFailure], None] = default_unhandled_fault_hook
"""Called once per failure that reaches the root unhandled. Replace it to decide:
return to ignore the failure; raise (the default raises ``SystemExit(1)``) to report it on
stderr and end the controller with exit code 1."""


# Monarch's worker loop and attach, offered from this module as Monarch does (its actor
# bootstrap); imported on first use, so that ``import regency.actor`` stays light.
_WORKER_LOOP = (
    "run_worker_loop_forever",
    "run_worker_loop_until_shutdown",
    "start_worker_loop_forever",
)


def __getattr__(name: str) -> Any:
    if name == "attach_to_workers":
        from regency.actor._attach import attach_to_workers

        return attach_to_workers
    if name in _WORKER_LOOP:
        from regency.actor import _worker

        return getattr(_worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "attach_to_workers", *_WORKER_LOOP})


_public.publish(__name__, globals())
