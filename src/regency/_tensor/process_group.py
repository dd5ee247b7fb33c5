"""``mesh.process_group(dims)`` on the controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from regency._tensor import commands as c


class RemoteProcessGroup:
    """``mesh.process_group(dims)``: passed to a remote function, it arrives as the worker's
    real ``torch.distributed`` process group over ``dims``."""

    def __init__(self, mesh: Any, dims: Sequence[str]) -> None:
        self.mesh = mesh
        self.dims = tuple(dims)

    def size(self) -> int:
        """Members per group."""
        return int(self.mesh.size(list(self.dims)))

    def _group_ref(self) -> c.GroupRef:
        from regency._tensor.engine import View
        from regency._tensor.reducing import group_ref

        return group_ref(View(self.mesh), self.dims, torch.device("cpu"))

    def __repr__(self) -> str:
        return f"RemoteProcessGroup(dims={self.dims})"
