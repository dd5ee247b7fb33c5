"""The owner actor of the RDMA figure, written once and wrapped into each system's types.

The owner holds a buffer of random bytes (a uint8 numpy array), registers it as an
``RDMABuffer`` of its system when asked (``register``) and returns the buffer, which travels as
a handle; the benchmark then reads and writes it one-sidedly and asks for ``digest`` to check
what arrived. Worker processes import this module; numpy is imported when an owner is made.
"""

from __future__ import annotations

import hashlib
import importlib
from types import ModuleType
from typing import Any

OWNER_ENDPOINTS = ("register", "digest")


class RDMAOwnerBehavior:
    """Owns ``nbytes`` random bytes and registers them with ``module`` (``*.rdma``)."""

    def __init__(self, module: str, nbytes: int) -> None:
        import numpy as np

        self._module = module
        self._data = np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)
        # Monarch takes a torch tensor or a memoryview, and caches its registration by the
        # memoryview's identity: keep one alive, as a user would.
        self._view = memoryview(self._data)
        self._buffers: list[Any] = []

    def register(self, backend: str) -> Any:
        """Return a new ``RDMABuffer`` over the owner's bytes; ``"default"`` forces nothing."""
        rdma = importlib.import_module(self._module)
        if self._module.startswith("monarch"):
            buf = rdma.RDMABuffer(self._view)
        else:
            buf = rdma.RDMABuffer(self._data, backend=None if backend == "default" else backend)
        self._buffers.append(buf)
        return buf

    def digest(self) -> str:
        """Return the SHA-256 (hex) of the owner's bytes as they are now."""
        return hashlib.sha256(self._view).hexdigest()


def make_owner_class(api: ModuleType) -> type:
    """Return an ``RDMAOwner`` actor class for the Monarch API module ``api``."""
    namespace: dict[str, Any] = {"__init__": RDMAOwnerBehavior.__init__}
    namespace.update(
        {name: api.endpoint(getattr(RDMAOwnerBehavior, name)) for name in OWNER_ENDPOINTS}
    )
    return type("RDMAOwner", (api.Actor, RDMAOwnerBehavior), namespace)
