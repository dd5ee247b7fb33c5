"""How a remote function travels: by import path where it has one, else cloudpickled."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

_resolved: dict[FunctionRef, Callable[..., Any]] = {}


@dataclass(frozen=True, slots=True)
class FunctionRef:
    """``path`` ("pkg.mod.fn") for importable functions; ``pickled`` for closures and
    ``__main__`` functions (the bytes are made once per function on the controller)."""

    path: str | None = None
    pickled: bytes | None = None

    @classmethod
    def of(cls, fn: Callable[..., Any] | str) -> FunctionRef:
        """The reference for ``fn``: a dotted path string, or a callable."""
        if isinstance(fn, str):
            return cls(path=fn)
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        if module and module != "__main__" and "<" not in qualname:
            return cls(path=f"{module}.{qualname}")
        return cls(pickled=cloudpickle.dumps(fn))

    def resolve(self) -> Callable[..., Any]:
        """The callable (cached per process)."""
        fn = _resolved.get(self)
        if fn is None:
            fn = _import(self.path) if self.path is not None else cloudpickle.loads(self.pickled)
            _resolved[self] = fn
        return fn

    def name(self) -> str:
        """A short name for error texts."""
        if self.path is not None:
            return self.path
        fn = self.resolve()
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def _import(path: str) -> Callable[..., Any]:
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        # A module-level ``@remote`` function: its name is bound to the Remote wrapper.
        obj = getattr(obj, "_regency_local", obj)
        if not callable(obj):
            raise TypeError(f"remote function {path!r} is not callable")
        return obj  # type: ignore[no-any-return]
    raise ModuleNotFoundError(f"cannot import the module of remote function {path!r}")
