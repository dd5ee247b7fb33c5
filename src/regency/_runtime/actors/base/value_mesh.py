"""``ValueMesh``: one value per rank of a mesh, shaped like the mesh it came from."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pprint import pformat
from textwrap import indent
from typing import Any, Generic, TypeVar

from regency._runtime.actors.base.mesh_trait import MeshTrait
from regency._runtime.kernel import codec
from regency.shape import Point, Shape

R = TypeVar("R")


class _Raw:
    """A reply not unpickled yet."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = parts


class ValueMesh(MeshTrait, Generic[R]):
    """A mesh of values, e.g. the result of ``endpoint.call()``.

    Iterating yields ``(Point, value)`` pairs in rank order; ``item(**coords)`` picks one value;
    it slices, flattens, renames and splits like any mesh. Values arrive undecoded and are
    unpickled the first time they are read.
    """

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if len(values) != len(shape):
            raise ValueError(
                f"ValueMesh of shape {shape} needs {len(shape)} values, got {len(values)}"
            )
        base = Shape.from_extent(shape.extent)
        self._init(base, list(values))

    def _init(self, shape: Shape, store: list[Any]) -> None:
        self._shape = shape
        self._store = store

    @classmethod
    def from_indexed(cls, shape: Shape, pairs: Iterable[tuple[int, R]]) -> ValueMesh[R]:
        """Build from ``(rank, value)`` pairs; every rank must appear (the last one wins)."""
        values: dict[int, R] = {}
        for rank, value in pairs:
            values[rank] = value
        missing = [r for r in range(len(shape)) if r not in values]
        if missing:
            raise ValueError(f"ValueMesh.from_indexed is missing ranks {missing}")
        return cls(shape, [values[r] for r in range(len(shape))])

    @classmethod
    def _from_raw(cls, dense: Shape, raws: list[Sequence[Any]]) -> ValueMesh[Any]:
        """Undecoded replies, in rank order, on ``dense`` (ranks numbered from 0)."""
        mesh: ValueMesh[Any] = object.__new__(cls)
        mesh._init(dense, [_Raw(p) for p in raws])
        return mesh

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        mesh: ValueMesh[R] = object.__new__(type(self))
        mesh._init(shape, self._store)
        return mesh

    def _value_at(self, base_rank: int) -> R:
        value = self._store[base_rank]
        if type(value) is _Raw:
            value = codec.loads_reply(value.parts)
            self._store[base_rank] = value
        return value  # type: ignore[no-any-return]

    def items(self) -> Iterable[tuple[Point, R]]:
        """``(point, value)`` pairs in rank order."""
        extent = self._shape.extent
        for i, base in enumerate(self._shape.ranks()):
            yield Point(i, extent), self._value_at(base)

    def values(self) -> Iterable[R]:
        """The values in rank order."""
        for base in self._shape.ranks():
            yield self._value_at(base)

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return iter(self.items())

    def item(self, **coords: int) -> R:
        """The value at ``coords`` (every dimension must be given)."""
        labels = self._shape.labels
        extra = sorted(set(coords) - set(labels))
        if extra:
            raise KeyError(f"item has extra dimensions: {extra}; this mesh has {list(labels)}")
        missing = [label for label in labels if label not in coords]
        if missing:
            raise KeyError(f"item() needs a coordinate for every dimension; missing {missing}")
        sliced = self._shape.slice(**coords)
        return self._value_at(sliced.ranks()[0])

    def get(self, index: int) -> R:
        """The value at position ``index`` in rank order."""
        return self._value_at(self._shape.ranks()[index])

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._shape, [self._value_at(b) for b in range(len(self._store))]))

    def __repr__(self) -> str:
        # Monarch's layout: the extent, then the (point, value) pairs pretty-printed.
        body = indent(pformat(tuple(self.items())), "  ")
        return f"ValueMesh({self._shape.extent}):\n{body}"

    __str__ = __repr__


def _rebuild(shape: Shape, store: list[Any]) -> ValueMesh[Any]:
    mesh: ValueMesh[Any] = object.__new__(ValueMesh)
    mesh._init(shape, store)
    return mesh
