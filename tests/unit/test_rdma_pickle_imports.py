"""An ``RDMABuffer`` unpickles through the ``regency.rdma`` package, never a submodule first.

A proc that receives a buffer may be importing ``regency.rdma`` on another thread at the same
moment (an actor class that uses it arriving by value). Importing a submodule while the package
is half-initialized by another thread breaks on the package's internal imports, so the first
module the pickle names must be the package itself, whose import lock serializes threads.
"""

from __future__ import annotations

import pickle
import pickletools

import numpy as np
import pytest

from regency.rdma import RDMABuffer

pytestmark = pytest.mark.timeout(30)


def _modules_named(data: bytes) -> list[str]:
    strings = [
        str(arg)
        for op, arg, _ in pickletools.genops(data)
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE")
    ]
    return [s for s in strings if s.startswith(("regency", "builtins"))]


def test_buffer_pickle_names_the_package_before_any_submodule() -> None:
    buf = RDMABuffer(np.arange(64, dtype=np.uint8))
    try:
        data = pickle.dumps(buf, protocol=5)
        regency_modules = [m for m in _modules_named(data) if m.startswith("regency")]
        assert regency_modules[0] == "regency.rdma", regency_modules
        again = pickle.loads(data)
        assert isinstance(again, RDMABuffer)
        assert again == buf
    finally:
        buf.drop().get(timeout=10)
