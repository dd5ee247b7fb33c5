"""The process-global ref table of a worker process: ref id -> local tensor or a poison.

Shared by the tensor-worker actors of one process (one per stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from regency._errors import RegencyError
from regency._tensor.commands import GroupRef, Ref
from regency._tensor.trees import Node, registered, same_kind


@dataclass(frozen=True, slots=True)
class Poisoned:
    """Why a value could not be computed: the failing command's call site, rank, traceback."""

    site: int
    rank: int
    text: str


class Resident:
    """A worker-side object other than a tensor that a ref names (a pipe): it lives in the
    table until the controller deletes its ref."""

    __slots__ = ("__weakref__",)


TABLE: dict[int, torch.Tensor | Poisoned | Resident] = {}
GROUPS: list[Callable[[tuple[tuple[int, ...], ...], int], Any]] = []
"""The process-group lookup (``reduce_worker.group_for``, registered by that module)."""
IDENTITY: dict[str, int] = {}
"""``rank``: this process's world rank (set by its tensor worker)."""


class PoisonedInputError(RegencyError):
    """An argument of a command is poisoned; its outputs inherit the first poison."""

    def __init__(self, poison: Poisoned) -> None:
        super().__init__(poison.text)
        self.poison = poison


def resolve(obj: Any) -> Any:
    """``obj`` with every ``Ref`` replaced by its local tensor; raises ``PoisonedInputError``."""
    if isinstance(obj, Ref):
        value = TABLE[obj.id]
        if isinstance(value, Poisoned):
            raise PoisonedInputError(value)
        return value
    if isinstance(obj, tuple):
        return same_kind(obj, [resolve(x) for x in obj])
    if isinstance(obj, GroupRef):
        return GROUPS[0](obj.groups, IDENTITY["rank"])
    if isinstance(obj, list):
        return [resolve(x) for x in obj]
    if isinstance(obj, dict):
        return {k: resolve(v) for k, v in obj.items()}
    if isinstance(obj, Node):
        return obj.rebuilt(resolve)
    return obj


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """The tensors of a result in pytree order (the order the controller numbered them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for x in obj for t in tensor_leaves(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensor_leaves(x)]
    registration = registered(obj)
    if registration is not None:
        return [t for x in registration.flatten_fn(obj)[0] for t in tensor_leaves(x)]
    return []


def poison(refs: tuple[int, ...], why: Poisoned) -> None:
    """Mark ``refs`` as failed with ``why``."""
    for ref in refs:
        TABLE[ref] = why
