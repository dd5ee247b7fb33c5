"""Regency: a pure-Python single controller for distributed PyTorch.

The public API lives in subpackages: :mod:`regency.actor` (actors, meshes, messaging),
:mod:`regency.shape` (the ndslice algebra), :mod:`regency.tensor` (the tensor engine),
:mod:`regency.spmd` (torchrun's environment and SPMD launch) and :mod:`regency.config`
(settings). The names Monarch offers at its top level (``Extent``, ``Shape``, ``NDSlice``,
``Selection``, ``Future``, ``configure`` and its siblings, the tensor engine's) are offered
here too, each imported on first use. :class:`RegencyError` is the root of
every error regency raises (the tree is drawn in :mod:`regency._errors`).
"""

from __future__ import annotations

import importlib
from typing import Any

from regency import _hooks, _public
from regency._errors import RegencyError

__version__ = "0.1.0"

__all__ = ["RegencyError", "__version__"]

_public.publish(__name__, globals())

# Monarch's top-level tensor names; importing them imports torch, so only on first use.
_TENSOR_NAMES = (
    "DataDependentError",
    "OpaqueRef",
    "RemoteException",
    "RemoteProcessGroup",
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
)

# Monarch's other top-level names: (module, attribute), imported on first use too, so that
# ``import regency`` stays light. ``Future`` is what ``fetch_shard`` returns.
_LAZY_NAMES = {
    "Extent": ("regency.shape", "Extent"),
    "Shape": ("regency.shape", "Shape"),
    "NDSlice": ("regency.shape", "Slice"),
    "Selection": ("regency.shape", "Selection"),
    "Future": ("regency.actor", "Future"),
    "configure": ("regency.config", "configure"),
    "configured": ("regency.config", "configured"),
    "get_global_config": ("regency.config", "get_global_config"),
    "get_runtime_config": ("regency.config", "get_runtime_config"),
    "clear_runtime_config": ("regency.config", "clear_runtime_config"),
    **{name: ("regency.tensor", name) for name in _TENSOR_NAMES},
}


# The composition root: the runtime's hooks upwards (regency._hooks), each a loader that imports
# its layer on first use, so the runtime names no module above it and loads torch only if used.


def _tensor_engine() -> _hooks.TensorHooks:
    """The tensor engine's face for ``ProcMesh.activate()`` and its siblings (imports torch)."""
    import regency._tensor.api

    return regency._tensor.api


def _debugger() -> _hooks.DebuggerHooks:
    """The debugger's proc side, for ``breakpoint()`` in a proc."""
    import regency.observe.pdb_session

    return regency.observe.pdb_session


def _telemetry() -> _hooks.TelemetryHooks:
    """The telemetry layer's switch, for a process whose ``telemetry`` setting is on."""
    import regency.observe.telemetry.switch

    return regency.observe.telemetry.switch


def _boot() -> _hooks.Boot:
    """The controller's boot, for the first use of the runtime in the controller's process."""
    import regency._runtime.host.controller

    return regency._runtime.host.controller.bootstrap_controller


def _proc_mesh() -> _hooks.ProcMeshFactory:
    """The meshes' ``this_proc_mesh``, for ``instance.proc``."""
    import regency._runtime.actors.meshes.meshes

    return regency._runtime.actors.meshes.meshes.this_proc_mesh


def _fault_hook() -> _hooks.FaultHook:
    """``regency.actor.unhandled_fault_hook`` as it is now (users may replace it)."""
    import regency.actor

    return regency.actor.unhandled_fault_hook


def _hosts_from_config() -> _hooks.HostsFromConfig:
    """``regency.job.hosts_from_config``, for ``regency.actor.hosts_from_config``."""
    import regency.job

    return regency.job.hosts_from_config


_hooks.tensor.register(_tensor_engine)
_hooks.debugger.register(_debugger)
_hooks.telemetry.register(_telemetry)
_hooks.boot.register(_boot)
_hooks.proc_mesh.register(_proc_mesh)
_hooks.fault_hook.register(_fault_hook)
_hooks.hosts_from_config.register(_hosts_from_config)


def __getattr__(name: str) -> Any:
    found = _LAZY_NAMES.get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = found
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_NAMES})
