"""User classes registered with torch's pytree (``torch.utils._pytree.register_pytree_node``,
e.g. `OpaqueRef`) in remote functions' arguments and results.

Lists, tuples and dicts are walked by the engine itself; an object of another registered class
is flattened into its children, which are walked as any argument or result, and rebuilt from
them on the other side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch.utils._pytree as pytree


def same_kind(obj: list[Any] | tuple[Any, ...], items: Iterable[Any]) -> Any:
    """A list or tuple of ``obj``'s own type holding ``items``: a named tuple takes its fields
    as arguments (``Pair(*items)``), every other sequence type the iterable."""
    kind = type(obj)
    if kind is tuple:
        return tuple(items)
    if kind is list:
        return list(items)
    if isinstance(obj, tuple) and hasattr(kind, "_fields"):
        return kind(*items)
    return kind(items)


def registered(obj: Any) -> Any:
    """The pytree registration of ``obj``'s class, or ``None``. Callers walk lists, tuples and
    dicts (and their subclasses) first: they are the engine's own."""
    return pytree.SUPPORTED_NODES.get(type(obj))


@dataclass(frozen=True, slots=True)
class Node:
    """A registered object as its class, flatten context and children: encoded children in a
    command's arguments (the worker rebuilds it from the values it resolves), described ones in
    a result's description (the controller rebuilds it from the mesh tensors it makes)."""

    kind: type
    context: Any
    children: tuple[Any, ...]

    @classmethod
    def of(cls, obj: Any, registration: Any, child: Callable[[Any], Any]) -> Node:
        """``obj`` flattened, each child mapped through ``child``."""
        children, context = registration.flatten_fn(obj)
        return cls(type(obj), context, tuple(child(x) for x in children))

    def rebuilt(self, value_of: Callable[[Any], Any]) -> Any:
        """The object again, each child mapped through ``value_of``."""
        node = pytree.SUPPORTED_NODES[self.kind]
        return node.unflatten_fn([value_of(x) for x in self.children], self.context)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Node, (self.kind, self.context, self.children)
