"""`Shape`: labelled dimensions over a `Slice`, with Monarch's mesh operations."""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import NoReturn

from . import _ops
from ._errors import DimensionNotFoundError
from ._extent import Extent, Point, _check_labels
from ._slice import Slice
from ._text import quoted


class Shape:
    """Named dimensions over a `Slice` of base ranks: the geometry of every mesh.

    A mesh of 2 hosts by 3 gpus whose procs have base ranks 0..5::

        >>> s = Shape(["hosts", "gpus"], Slice.new_row_major([2, 3]))
        >>> str(s), len(s), s.sizes
        ('{hosts=2,gpus=3}', 6, {'hosts': 2, 'gpus': 3})
        >>> s.slice(gpus=slice(1, 3)).ranks()
        [1, 2, 4, 5]
        >>> s.slice(hosts=1).ranks()
        [3, 4, 5]

    Views made with `slice`, `at` or `select` keep referring to the base ranks of the
    shape they came from: their ``ndslice`` has a new offset and strides, not renumbered
    ranks. `Shape` also carries the other operations of Monarch's ``MeshTrait``
    (`flatten`, `rename`, `split`, `size`, `sizes`, `extent`, ``len``) so that every mesh
    type can delegate to its shape. Shapes are immutable, hashable and picklable.

    The slice is the ``ndslice`` property; the name ``slice`` is the mesh operation.
    """

    __slots__ = ("_extent", "_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: Slice
    _extent: Extent | None

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        if not isinstance(slice, Slice):
            raise TypeError(f"Shape needs a Slice, got {type(slice).__name__}")
        lab = _check_labels(labels, "Shape")
        if len(lab) != slice.ndim:
            raise ValueError(
                f"label slice dimension mismatch: {len(lab)} labels for a "
                f"{slice.ndim}-dimensional slice"
            )
        object.__setattr__(self, "_labels", lab)
        object.__setattr__(self, "_slice", slice)
        object.__setattr__(self, "_extent", None)

    @classmethod
    def _make(cls, labels: tuple[str, ...], ndslice: Slice) -> Shape:
        # Labels come from an operation that already validated them.
        shape = object.__new__(cls)
        object.__setattr__(shape, "_labels", labels)
        object.__setattr__(shape, "_slice", ndslice)
        object.__setattr__(shape, "_extent", None)
        return shape

    # -- construction -----------------------------------------------------------------

    @staticmethod
    def unity() -> Shape:
        """Return the 0-dimensional shape of one element (base rank 0)."""
        return Shape._make((), Slice(0, [], []))

    @staticmethod
    def from_extent(extent: Extent) -> Shape:
        """Return the dense row-major shape of ``extent`` at offset 0."""
        return Shape._make(tuple(extent.labels), Slice.new_row_major(extent.sizes))

    # -- properties -------------------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a new list on every access)."""
        return list(self._labels)

    @property
    def ndslice(self) -> Slice:
        """The `Slice` mapping this shape's coordinates to base ranks."""
        return self._slice

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._labels)

    @property
    def extent(self) -> Extent:
        """The `Extent` of this shape: its labels and sizes."""
        extent = self._extent
        if extent is None:  # computed once; a benign race at worst builds it twice
            extent = Extent(self._labels, self._slice.sizes)
            object.__setattr__(self, "_extent", extent)
        return extent

    @property
    def sizes(self) -> dict[str, int]:
        """A new dict mapping each label to its size, in dimension order."""
        return dict(zip(self._labels, self._slice.sizes, strict=True))

    def __len__(self) -> int:
        return len(self._slice)

    # -- ndslice-level selection (Monarch's Shape API; errors are ValueError) ---------

    def _dim(self, label: str) -> int:
        try:
            return self._labels.index(label)
        except ValueError:
            raise DimensionNotFoundError(
                f"invalid label {label!r}: shape {self} has dimensions {list(self._labels)}"
            ) from None

    def at(self, label: str, index: int) -> Shape:
        """Fix dimension ``label`` at ``index`` and remove it (offset += index * stride).

        Unknown labels and indices past the end raise ``ValueError``; a negative index
        raises ``OverflowError``, as Monarch does.
        """
        dim = self._dim(label)
        i = operator.index(index)
        if i < 0:
            raise OverflowError(f"can't convert negative index {i} to an unsigned int")
        sizes, strides = self._slice.sizes, self._slice.strides
        if i >= sizes[dim]:
            raise ValueError(f"index {i} out of range for dimension {label!r} of size {sizes[dim]}")
        offset = self._slice.offset + i * strides[dim]
        del sizes[dim], strides[dim]
        labels = self._labels[:dim] + self._labels[dim + 1 :]
        return Shape._make(labels, Slice(offset, sizes, strides))

    def select(self, label: str, s: builtins.slice | range) -> Shape:
        """Restrict dimension ``label`` to ``s`` and keep it.

        ``s`` is resolved with Python's rules (negative and ``None`` bounds); then
        offset += start * stride, size = len(range), stride *= step. Unknown labels, a
        step <= 0, and empty or out-of-range selections raise ``ValueError``.
        """
        dim = self._dim(label)
        if not isinstance(s, (builtins.slice, range)):
            raise TypeError(f"select() needs a slice or range, got {type(s).__name__}")
        sizes, strides = self._slice.sizes, self._slice.strides
        selected = _ops._range_of(s, label, sizes[dim])
        if not selected:
            if selected.start >= sizes[dim]:
                raise ValueError(
                    f"out of range {selected.start}:{selected.stop}:{selected.step} "
                    f"for dimension {label!r} of size {sizes[dim]}"
                )
            raise ValueError(f"empty range {selected.start}:{selected.stop}:{selected.step}")
        offset = self._slice.offset + selected.start * strides[dim]
        sizes[dim] = len(selected)
        strides[dim] *= selected.step
        return Shape._make(self._labels, Slice(offset, sizes, strides))

    def index(self, **coords: int) -> Shape:
        """Fix several dimensions at once: ``shape.index(gpu=3, host=0)`` removes both."""
        shape = self
        for label, i in coords.items():
            shape = shape.at(label, i)
        return shape

    # -- base ranks ---------------------------------------------------------------------

    def ranks(self) -> list[int]:
        """Return the base ranks of this shape in row-major order."""
        return list(self._slice)

    def coordinates(self, base_rank: int) -> dict[str, int]:
        """Return the coordinates of ``base_rank``; ``ValueError`` if it is not in the shape."""
        coords = self._slice.coordinates(base_rank)
        return dict(zip(self._labels, coords, strict=True))

    def rank_of(self, base_rank: int) -> int:
        """Return the row-major position of ``base_rank`` here (``ValueError`` if absent)."""
        return self._slice.index(base_rank)

    def point_of_base_rank(self, base_rank: int) -> Point:
        """Return the `Point` of ``base_rank`` within this shape (``ValueError`` if absent)."""
        return Point(self._slice.index(base_rank), self.extent)

    # -- MeshTrait operations -----------------------------------------------------------

    def slice(self, **dims: int | builtins.slice | range) -> Shape:
        """Return the view selected by ``dims`` (Monarch's ``mesh.slice``).

        An int selects one index and removes the dimension; a ``slice`` or ``range``
        restricts it and keeps it (Python semantics for negative and ``None`` bounds, step
        > 0). An unknown label raises ``TypeError``; an int outside ``range(size)``,
        negative ones included, raises ``IndexError``. Accepts a `Point`: ``**point``.
        """
        if not dims:
            return self
        labels, ndslice = _ops.slice_dims(self._labels, self._slice, dims, self._describe())
        return Shape._make(labels, ndslice)

    def flatten(self, name: str) -> Shape:
        """Collapse all dimensions into one named ``name``.

        Only dense shapes (ranks contiguous in row-major order) can be flattened;
        others raise ``ValueError``. ``m.flatten("rank").slice(rank=0)`` is the idiom for
        the first element.
        """
        labels, ndslice = _ops.flatten(self._labels, self._slice, name, self._describe())
        return Shape._make(labels, ndslice)

    def rename(self, **old_to_new: str) -> Shape:
        """Rename dimensions, ``shape.rename(host="dp", gpu="tp")``; others keep their names.

        An unknown old label or a resulting duplicate raises ``ValueError``.
        """
        labels, ndslice = _ops.rename(self._labels, self._slice, old_to_new, self._describe())
        return Shape._make(labels, ndslice)

    def split(self, **kwargs: Sequence[str] | int) -> Shape:
        """Split dimensions into several, e.g. ``split(host=("dp", "pp"), pp=16)``.

        A keyword naming an existing dimension gives the new names it splits into
        (row-major, so the last new name varies fastest); any other keyword gives the size
        of a new dimension. At most one size per split may be left out and is inferred.
        Sizes that do not divide, several unknown sizes, unused sizes and duplicate names
        raise ``ValueError``.
        """
        labels, ndslice = _ops.split(self._labels, self._slice, kwargs, self._describe())
        return Shape._make(labels, ndslice)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Return the number of elements: in total, along ``dim``, or over several dims.

        An unknown dimension raises `DimensionNotFoundError` (a ``KeyError``).
        """
        return _ops.size_of(self._labels, self._slice, dim, self._describe())

    # -- value semantics --------------------------------------------------------------

    def _describe(self) -> str:
        return f"shape {self}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((self._labels, self._slice))

    def __str__(self) -> str:
        dims = zip(self._labels, self._slice.sizes, strict=True)
        return "{" + ",".join(f"{label}={n}" for label, n in dims) + "}"

    def __repr__(self) -> str:
        labels = ", ".join(quoted(label) for label in self._labels)
        return f"Shape {{ labels: [{labels}], slice: {self._slice!r} }}"

    def __reduce__(self) -> tuple[type[Shape], tuple[list[str], Slice]]:
        return (Shape, (list(self._labels), self._slice))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Shape is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Shape is immutable; cannot delete {name!r}")
