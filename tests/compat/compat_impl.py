"""The one place the compatibility suite names an implementation.

Every scenario in ``tests/compat`` imports Monarch's public modules from here, so the same file
runs against real Monarch (``COMPAT_IMPL=monarch``, in a venv with torchmonarch) or against
regency (``COMPAT_IMPL=regency``, the default). Nothing else in the suite may import ``monarch``
or ``regency`` directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

IMPL = os.environ.get("COMPAT_IMPL", "regency")
if IMPL not in ("monarch", "regency"):
    raise RuntimeError(f"COMPAT_IMPL must be 'monarch' or 'regency', not {IMPL!r}")
MONARCH = IMPL == "monarch"
REGENCY = IMPL == "regency"

if MONARCH:
    if importlib.util.find_spec("regency") is not None:
        raise RuntimeError("the Monarch run must not be able to import regency: fix sys.path")
    import monarch as top
    import monarch.actor as actor
    import monarch.config as config
    import monarch.job as job
    import monarch.rdma as rdma
    from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice
    from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
else:
    import regency as top
    import regency.actor as actor
    import regency.config as config
    import regency.job as job
    import regency.rdma as rdma
    from regency.actor import SupervisionError
    from regency.shape import Shape, Slice


def optional(name: str) -> ModuleType | None:
    """``<impl>.<name>`` (e.g. ``spmd``), or None where this implementation lacks the module."""
    try:
        return importlib.import_module(f"{IMPL}.{name}")
    except ImportError:
        return None


__all__ = [
    "IMPL",
    "MONARCH",
    "REGENCY",
    "Shape",
    "Slice",
    "SupervisionError",
    "actor",
    "config",
    "job",
    "optional",
    "rdma",
    "top",
]
