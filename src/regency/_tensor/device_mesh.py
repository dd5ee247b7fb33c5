"""Monarch's ``spawn_tensor_engine(proc_mesh)``: a device mesh with ``.exit()``, for programs
written against ``monarch.mesh_controller``. In regency a proc mesh is its own device mesh
(``procs.activate()``); this is that proc mesh under Monarch's device mesh names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from regency._tensor.api import activate, rank_tensor
from regency._tensor.engine import known_root
from regency._tensor.mesh_tensor import MeshTensor


class DeviceMesh:
    """A proc mesh as Monarch's ``DeviceMesh``: ``activate()``, ``flatten``/``slice``/``rename``,
    ``rank(dims)``, ``ranks`` and the rest of the proc mesh's names, and ``exit()``. Mesh tensors
    made inside its ``activate()`` have it as their ``.mesh``."""

    def __init__(self, procs: Any) -> None:
        self._device_procs = procs
        self._exited = False

    def _live(self) -> Any:
        if self._exited:
            raise RuntimeError("this device mesh was exited (spawn_tensor_engine(...).exit())")
        return self._device_procs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_device_procs", "_exited"):
            raise AttributeError(name)
        return getattr(self._live(), name)

    def activate(self) -> Any:
        """``with dm.activate():`` as ``procs.activate()``, with ``dm`` the active mesh."""
        self._live()
        return activate(self)

    def rank(self, dims: str | Sequence[str]) -> MeshTensor:
        """Each proc's rank over ``dims`` (``procs.rank_tensor(dims)``)."""
        self._live()
        return rank_tensor(self, dims)

    @property
    def ranks(self) -> dict[str, MeshTensor]:
        """``{dim: rank(dim)}`` for every dimension."""
        return {dim: self.rank(dim) for dim in self._live()._shape.labels}

    def exit(self) -> None:
        """Send the pending commands and retire this device mesh: using it again raises
        ``RuntimeError``. Idempotent. The workers (and their tensors) live on until the proc
        mesh stops."""
        if self._exited:
            return
        root = known_root(self._device_procs)
        if root is not None:
            root.flush_all()
        self._exited = True

    def __repr__(self) -> str:
        state = ", exited" if self._exited else ""
        return f"DeviceMesh({self._device_procs!r}{state})"


def spawn_tensor_engine(proc_mesh: Any) -> DeviceMesh:
    """Monarch's ``monarch.mesh_controller.spawn_tensor_engine``: ``proc_mesh`` as a device mesh
    whose ``exit()`` ends its use."""
    return DeviceMesh(proc_mesh)
