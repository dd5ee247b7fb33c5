"""Layers above the runtime that the runtime must reach, found by name: registered, not imported.

``ProcMesh.activate()`` and its siblings belong to the tensor engine, which is built on the
actor API and needs torch; the runtime must not import it. The ``regency`` package registers a
loader for it here (:func:`register`), and the runtime asks for it (:func:`load`) on first use.
So no module of the runtime names a module above it, and nothing loads torch before it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_loaders: dict[str, Callable[[], Any]] = {}


def register(name: str, loader: Callable[[], Any]) -> None:
    """Make ``load(name)`` call ``loader`` (which imports the layer and returns its face)."""
    _loaders[name] = loader


def load(name: str) -> Any:
    """The face of the layer registered as ``name``."""
    try:
        loader = _loaders[name]
    except KeyError:
        raise RuntimeError(f"regency's {name!r} layer is not registered (import regency)") from None
    return loader()
