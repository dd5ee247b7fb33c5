"""Output metadata of an op on mesh tensors, computed on fake tensors and cached.

The cache key is (op, input metadata, non-tensor arguments): a repeated op costs one dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._python_dispatch import _disable_current_modes

from regency._tensor.errors import data_dependent
from regency._tensor.trees import Node, registered, same_kind


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What the controller knows about one shard: the same on every rank."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        """The metadata of a real or fake tensor."""
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    @classmethod
    def contiguous(
        cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> TensorMeta:
        """The metadata of a contiguous tensor of ``shape``."""
        # Computed here: a meta tensor made inside activate() would itself become a command.
        stride, step = [], 1
        for n in reversed(shape):
            stride.append(step)
            step *= max(n, 1)
        return cls(shape, tuple(reversed(stride)), dtype, device)


@dataclass(frozen=True, slots=True)
class OpSignature:
    """Per op: which results are written-through inputs (``returns``) and which inputs an op
    mutates, by position in the flattened tensor arguments."""

    returns: tuple[int | None, ...]
    mutates: tuple[int, ...]


_fake_log = logging.getLogger("torch._subclasses.fake_tensor")
_fake_mode: list[FakeTensorMode] = []
_cache: dict[Any, tuple[Any, OpSignature]] = {}
_signatures: dict[Any, tuple[tuple[str, ...], tuple[str | None, ...]]] = {}


def fake_mode() -> FakeTensorMode:
    """The one fake mode propagation runs under."""
    if not _fake_mode:
        _fake_mode.append(FakeTensorMode(allow_non_fake_inputs=True))
    return _fake_mode[0]


def fake_of(meta: TensorMeta) -> torch.Tensor:
    """A fake tensor with ``meta`` (call under ``fake_mode()``)."""
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device)


def propagate(
    op: Any, key: Any, fake_call: Callable[[], Any], arg_names: Callable[[], list[str | None]]
) -> tuple[Any, OpSignature]:
    """``(result with TensorMeta leaves, signature)`` of ``op``; ``fake_call`` runs it on fake
    inputs (only on a cache miss). ``arg_names`` names each flattened tensor input."""
    try:
        return _cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable argument: no caching for this call
        key = None
    # Fake mode logs a failing meta function before re-raising; the error itself is ours to raise.
    _fake_log.disabled = True
    try:
        # The modes of outer activate() blocks are still on the stack while the innermost one
        # dispatches: off, or they would run this fake call on their workers for real (a
        # nested activation issued every factory twice, once per block).
        with _disable_current_modes(), fake_mode():
            result = fake_call()
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        raise data_dependent(str(op)) from e
    finally:
        _fake_log.disabled = False
    described = describe(result)
    found = (described, _signature(op, arg_names()))
    if key is not None:
        _cache[key] = found
    return found


def describe(obj: Any) -> Any:
    """``obj`` with each tensor leaf replaced by its ``TensorMeta``."""
    if isinstance(obj, torch.Tensor):
        return TensorMeta.of(obj)
    if isinstance(obj, (tuple, list)):
        return same_kind(obj, [describe(x) for x in obj])
    if isinstance(obj, dict):
        return {k: describe(v) for k, v in obj.items()}
    registration = registered(obj)
    if registration is not None:  # a user class registered with torch's pytree
        return Node.of(obj, registration, describe)
    return obj


def _signature(op: Any, names: list[str | None]) -> OpSignature:
    """Map the schema's write aliases onto the tensor inputs (``names`` in flattened order)."""
    info = _signatures.get(op)
    if info is None:
        schema = op._schema
        written = tuple(a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write)
        sets = {
            frozenset(a.alias_info.before_set): a.name
            for a in schema.arguments
            if a.alias_info and a.alias_info.is_write
        }
        returns = tuple(
            sets.get(frozenset(r.alias_info.before_set))
            if r.alias_info and r.alias_info.is_write
            else None
            for r in schema.returns
        )
        info = (written, returns)
        _signatures[op] = info
    written, returned = info
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if name is not None:
            positions.setdefault(name, []).append(i)
    return OpSignature(
        tuple(positions[name][0] if name in positions else None for name in returned),
        tuple(i for name in written for i in positions.get(name, ())),
    )
