"""The two value types every runtime layer passes around: message parts and port references.

They live below the router (:mod:`regency._runtime.kernel.router`) so that modules the router
uses, such as :mod:`regency._runtime.kernel.casting`, can name them without importing it.
"""

from __future__ import annotations

from typing import NamedTuple

Part = bytes | bytearray | memoryview


class PortRef(NamedTuple):
    """Where a port lives: the owning process's address and the port's id there."""

    addr: str
    port: int
