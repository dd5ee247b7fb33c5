"""What the runtime and ``regency.actor`` expect from the layers above: typed, in one place.

The runtime (``regency._runtime``) never imports a module above it (the layer test,
``tests/unit/test_import_layers.py``, pins that). Where it must call up, it calls a hook declared
here: a :class:`typing.Protocol` says what the layer above provides, and a :class:`Hook` holds
the loader that the ``regency`` package, the composition root, registers when it is imported
(``regency/__init__.py``). A loader imports its layer on first use only, so ``import
regency.actor`` loads neither torch nor the debugger nor telemetry. ``mypy --strict`` checks
every call across the seam against these Protocols, and each loader's result against its
Protocol (a module satisfies a Protocol by its functions).

The hooks, by who calls them:

- :data:`tensor` (:class:`TensorHooks`) -- the tensor engine: ``ProcMesh.activate()``,
  ``rank_tensor(s)``, ``process_group()``, ``Endpoint.rref()``, and mesh tensors carried in
  actor calls (the send pipeline, actor meshes, the executors).
- :data:`telemetry` (:class:`TelemetryHooks`) -- telemetry's switch: the proc agent and the
  telemetry seam turn it on and off, the worker daemon serves the host's table rows.
- :data:`debugger` (:class:`DebuggerHooks`) -- ``breakpoint()`` in a proc.
- :data:`boot` (:class:`Boot`) -- the controller's boot, on the first use of the kernel's
  ``runtime()`` in the controller's process.
- :data:`proc_mesh` (:class:`ProcMeshFactory`) -- the singleton proc mesh of this process
  (``instance.proc``), built by the meshes, above the identity that asks for it.
- :data:`fault_hook` (:class:`FaultHook`) -- ``regency.actor.unhandled_fault_hook``, read at
  every failure that reaches the root unhandled (users may replace it at any time).
- :data:`hosts_from_config` (:class:`HostsFromConfig`) -- ``regency.actor.hosts_from_config``
  is ``regency.job``'s, a package built on ``regency.actor``.

The objects the runtime passes up (meshes, send pipelines, endpoint specs, failures) are typed
``Any`` here: this module sits below the runtime and cannot name them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "Boot",
    "DebuggerHooks",
    "FaultHook",
    "Hook",
    "HostsFromConfig",
    "ProcMeshFactory",
    "TelemetryHooks",
    "TensorHooks",
    "boot",
    "debugger",
    "fault_hook",
    "hosts_from_config",
    "proc_mesh",
    "telemetry",
    "tensor",
]


class TensorHooks(Protocol):
    """The tensor engine's face (``regency._tensor.api``), which needs torch."""

    def activate(self, mesh: Any) -> AbstractContextManager[Any]:
        """``ProcMesh.activate()``: make ``mesh`` the active mesh of tensor ops."""
        ...

    def rank_tensor(self, mesh: Any, dims: str | Sequence[str]) -> Any:
        """``ProcMesh.rank_tensor(dims)``: each rank's index along ``dims``."""
        ...

    def rank_tensors(self, mesh: Any) -> dict[str, Any]:
        """``ProcMesh.rank_tensors()``: one rank tensor per dimension."""
        ...

    def process_group(self, mesh: Any, dims: str | Sequence[str]) -> Any:
        """``ProcMesh.process_group(dims)``: a process group over ``dims`` of ``mesh``."""
        ...

    def actor_rref(
        self, pipeline: Any, name: str, spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """``Endpoint.rref(*args, **kwargs)`` on the endpoint ``name`` of ``pipeline``'s mesh."""
        ...

    def before_actor_send(
        self, carried: Sequence[Any], pipeline: Any, bases: Sequence[int]
    ) -> None:
        """Hand the mesh tensors a call ``carried`` to the actors at root ranks ``bases``."""
        ...

    def bind_arrivals(self, fn: Callable[..., Any], is_async: bool, carried: Sequence[Any]) -> Any:
        """``fn`` (an endpoint's function) made to wait for the mesh tensors it was carried."""
        ...

    def settle_arrivals(self, carried: Sequence[Any]) -> None:
        """Wait for the shards an actor's constructor arguments carried."""
        ...

    def discard_arrivals(self, carried: Sequence[Any]) -> None:
        """Free the shards carried by a call that will never run."""
        ...


class TelemetryHooks(Protocol):
    """Telemetry's switch (``regency.observe.telemetry.switch``)."""

    def follow(self, on: bool) -> None:
        """Start (``True``) or stop recording in this process."""
        ...

    def serve_rows(self, rt: Any) -> None:
        """Serve this host's rows of the job's telemetry tables on the router ``rt``."""
        ...


class DebuggerHooks(Protocol):
    """The debugger's proc side (``regency.observe.pdb_session``)."""

    def pause(self, frame: FrameType, *args: Any, **kwargs: Any) -> None:
        """``breakpoint()`` in a proc: a ``pdb`` session at ``frame``, driven from the client."""
        ...


class Boot(Protocol):
    """Starts the controller's runtime in this process (``regency._runtime.host.controller``)."""

    def __call__(self) -> None:
        """Boot the controller; afterwards the kernel's ``runtime()`` returns its router."""
        ...


class ProcMeshFactory(Protocol):
    """Builds the singleton proc mesh of the calling process (``this_proc``)."""

    def __call__(self) -> Any:
        """The calling process's proc mesh."""
        ...


class FaultHook(Protocol):
    """``regency.actor.unhandled_fault_hook``: given each failure the root did not handle."""

    def __call__(self, failure: Any, /) -> None:
        """Return to ignore ``failure`` (a ``MeshFailure``); raise to end the controller."""
        ...


class HostsFromConfig(Protocol):
    """``regency.job.hosts_from_config``, offered by ``regency.actor`` too, as in Monarch."""

    def __call__(self, name: str, /) -> Any:
        """The host mesh ``name`` of the project's configuration."""
        ...


_Face = TypeVar("_Face")


class Hook(Generic[_Face]):
    """One seam upwards: the loader a layer above registered, called at each use.

    The loader runs at every call (importing an already imported module costs a dict lookup),
    so a hook that reads a user-replaceable attribute (:data:`fault_hook`) sees its latest value.
    """

    __slots__ = ("_loader", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._loader: Callable[[], _Face] | None = None

    def register(self, loader: Callable[[], _Face]) -> None:
        """Make :meth:`load` call ``loader``, which imports its layer and returns its face."""
        self._loader = loader

    def load(self) -> _Face:
        """The face registered for this hook; ``RuntimeError`` naming it if none is."""
        loader = self._loader
        if loader is None:
            raise RuntimeError(f"regency's {self.name} is not registered (import regency)")
        return loader()


tensor: Hook[TensorHooks] = Hook("tensor engine")
telemetry: Hook[TelemetryHooks] = Hook("telemetry switch")
debugger: Hook[DebuggerHooks] = Hook("debugger")
boot: Hook[Boot] = Hook("controller boot")
proc_mesh: Hook[ProcMeshFactory] = Hook("proc mesh factory")
fault_hook: Hook[FaultHook] = Hook("unhandled fault hook")
hosts_from_config: Hook[HostsFromConfig] = Hook("hosts_from_config of regency.job")
