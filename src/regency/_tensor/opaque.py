"""Per-worker Python objects named from the controller (Monarch's ``OpaqueRef`` and
``OpaqueObject``).

An `OpaqueRef` made on a worker (in a remote function) holds the object there under a small
key tensor; returned from a remote function it reaches the controller as an `OpaqueRef` whose
key is a mesh tensor, and passed to another remote function it arrives as the worker's own
reference, whose ``.value`` is the object. The object lives as long as the controller's
reference does: the worker keeps it under the key's ref, freed when the mesh tensor is.
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.weak import WeakTensorKeyDictionary

from regency._tensor.remote import call_on_shard_and_fetch, remote
from regency._tensor.table import IDENTITY

__all__ = ["OpaqueObject", "OpaqueRef", "opaque_method"]

_F = TypeVar("_F", bound=Callable[..., Any])
_values = WeakTensorKeyDictionary()
_keys = itertools.count(1)


def _on_worker() -> bool:
    return "rank" in IDENTITY


def _propagating() -> bool:
    """Inside a ``propagate`` function on the controller (under fake mode)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


class OpaqueRef:
    """A reference to a Python object that exists only on the workers.

    Make one in a remote function (``OpaqueRef(model)``) and return it; the controller gets a
    reference it can pass to later remote functions, where ``ref.value`` is the object::

        @remote(propagate=lambda: OpaqueRef(None))
        def make_model() -> OpaqueRef:
            return OpaqueRef(torch.nn.Linear(3, 4))

        @remote(propagate=lambda ref, x: torch.empty(x.shape[0], 4))
        def forward(ref: OpaqueRef, x: torch.Tensor) -> torch.Tensor:
            return ref.value(x)

    On the controller, ``.value`` and ``OpaqueRef(value)`` (outside a ``propagate`` function)
    raise ``RuntimeError``.
    """

    _key: torch.Tensor

    def __init__(self, value: Any = None) -> None:
        if not (_on_worker() or _propagating()):
            self._refuse("create")
        self._key = torch.tensor(next(_keys), dtype=torch.int64)
        if not isinstance(self._key, FakeTensor):
            _values[self._key] = value

    @classmethod
    def _create(cls, key: torch.Tensor) -> OpaqueRef:
        ref = cls.__new__(cls)
        ref._key = key
        return ref

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, tuple[Any, ...]]:
        # what travels is the key (a subclass degrades into the plain reference, as Monarch's)
        return OpaqueRef._create, (self._key,)

    def __repr__(self) -> str:
        return f"OpaqueRef({self._key!r})"

    @property
    def value(self) -> Any:
        """The object (on a worker only)."""
        self._check("access")
        return _values[self._key]

    @value.setter
    def value(self, new: Any) -> None:
        self._check("set")
        _values[self._key] = new

    def _check(self, what: str) -> None:
        if not (_on_worker() or isinstance(self._key, FakeTensor)):
            self._refuse(what)

    @staticmethod
    def _refuse(what: str) -> None:
        raise RuntimeError(
            f"Client is attempting to {what} an OpaqueRef. This can only be done in a remote "
            "function."
        )


def _flatten(ref: OpaqueRef) -> tuple[list[torch.Tensor], None]:
    return [ref._key], None


def _unflatten(children: Iterable[Any], _: None) -> OpaqueRef:
    (key,) = children
    return OpaqueRef._create(key)


pytree.register_pytree_node(OpaqueRef, _flatten, _unflatten)


def _resolved(constructor: str | Callable[..., Any]) -> Callable[..., Any]:
    if not isinstance(constructor, str):
        return constructor
    module, _, name = constructor.rpartition(".")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def _fresh(*_: Any, **__: Any) -> OpaqueRef:
    return OpaqueRef(None)


@remote(propagate=_fresh)
def _construct_object(
    constructor: str | Callable[..., Any], *args: Any, **kwargs: Any
) -> OpaqueRef:
    return OpaqueRef(_resolved(constructor)(*args, **kwargs))


def _invoke_method(obj: OpaqueRef, method_name: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(obj.value, method_name)(*args, **kwargs)


class OpaqueObject(OpaqueRef):
    """An `OpaqueRef` with methods: declare each with `opaque_method`, whose body is the
    method's propagation (what its results look like); calling it runs the object's method of
    that name on every worker::

        class Counter(OpaqueObject):
            @opaque_method
            def add(self, t: torch.Tensor) -> torch.Tensor:
                return t          # the result is shaped like t

        counter = Counter("mypkg.counters.Counter", start=3)   # made on every worker
        total = counter.add(torch.ones(2))                     # Counter.add on the workers

    ``constructor`` is an import path (``"pkg.mod.name"``) or a module-level callable, run on
    every worker with ``*args, **kwargs``; or an existing `OpaqueRef` to wrap.
    """

    def __init__(
        self, constructor: str | Callable[..., Any] | OpaqueRef, *args: Any, **kwargs: Any
    ) -> None:
        if isinstance(constructor, OpaqueRef):
            self._key = constructor._key
        else:
            self._key = _construct_object(constructor, *args, **kwargs)._key

    def _plain(self) -> OpaqueRef:
        return OpaqueRef._create(self._key)

    def call_method(
        self, method_name: str, propagation: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``method_name`` of the object on every worker; ``propagation(self, *args,
        **kwargs)`` describes its results."""
        method = remote(
            _invoke_method,
            propagate=lambda obj, _name, *a, **k: propagation(obj, *a, **k),
        )
        return method(self._plain(), method_name, *args, **kwargs)

    def call_method_on_shard_and_fetch(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on one shard and fetch its result (a `Future`)."""
        return call_on_shard_and_fetch(
            remote(_invoke_method), self._plain(), method_name, *args, **kwargs
        )


def opaque_method(fn: _F) -> _F:
    """Declare a method of an `OpaqueObject` subclass; ``fn`` is its propagation."""

    @functools.wraps(fn)
    def impl(self: OpaqueObject, *args: Any, **kwargs: Any) -> Any:
        return self.call_method(fn.__name__, fn, *args, **kwargs)

    return impl  # type: ignore[return-value]
