"""Monarch's ``monarch.mesh_controller``: ``RemoteException`` and ``spawn_tensor_engine``.

``spawn_tensor_engine(procs)`` gives the proc mesh as a device mesh with ``.exit()``.
"""

from __future__ import annotations

from regency._tensor.device_mesh import DeviceMesh, spawn_tensor_engine
from regency._tensor.errors import RemoteException

__all__ = ["DeviceMesh", "RemoteException", "spawn_tensor_engine"]
