"""Monarch's ``monarch.mesh_controller`` path for the tensor engine's remote error."""

from __future__ import annotations

from regency._tensor.errors import RemoteException

__all__ = ["RemoteException"]
