"""`Extent` (labelled sizes of a dense space) and `Point` (one position in an extent)."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from ._errors import DimensionNotFoundError
from ._text import label_key


def _check_labels(labels: Sequence[str], what: str) -> tuple[str, ...]:
    """Return ``labels`` as a tuple of unique strings, or raise ``TypeError``/``ValueError``."""
    if isinstance(labels, str):
        raise TypeError(f"{what} labels must be a sequence of str, not a str ({labels!r})")
    result = tuple(labels)
    for label in result:
        if not isinstance(label, str):
            raise TypeError(f"{what} labels must be str, got {type(label).__name__}: {label!r}")
    if len(set(result)) != len(result):
        dups = sorted({label for label in result if result.count(label) > 1})
        raise ValueError(f"{what} labels must be unique; repeated: {dups}")
    return result


class Extent(Mapping[str, int]):
    """The labelled sizes of a dense N-dimensional space, e.g. ``{hosts: 2, gpus: 4}``.

    An extent is a read-only mapping from label to size, in dimension order::

        >>> e = Extent(["hosts", "gpus"], [2, 4])
        >>> e["gpus"], e.nelements, list(e)
        (4, 8, ['hosts', 'gpus'])

    Labels must be unique strings and sizes non-negative integers (``ValueError``
    otherwise, also when the two sequences differ in length). Extents are immutable,
    hashable and picklable; two extents are equal when their labels and sizes are equal,
    in order. Looking up an unknown label raises `DimensionNotFoundError`, which is both
    a ``KeyError`` and a ``ValueError``.
    """

    __slots__ = ("_hash", "_index", "_labels", "_nelements", "_sizes")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _index: dict[str, int]
    _nelements: int
    _hash: int

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        lab = _check_labels(labels, "Extent")
        sz: list[int] = []
        for n in sizes:
            if isinstance(n, bool):
                raise TypeError("Extent sizes must be int, not bool")
            size = operator.index(n)
            if size < 0:
                raise ValueError(f"Extent sizes must be >= 0, got {size}")
            sz.append(size)
        if len(lab) != len(sz):
            raise ValueError(f"Extent needs one size per label: {len(lab)} labels, {len(sz)} sizes")
        total = 1
        for size in sz:
            total *= size
        object.__setattr__(self, "_labels", lab)
        object.__setattr__(self, "_sizes", tuple(sz))
        object.__setattr__(self, "_index", {label: i for i, label in enumerate(lab)})
        object.__setattr__(self, "_nelements", total)
        object.__setattr__(self, "_hash", hash((lab, tuple(sz))))

    @property
    def labels(self) -> list[str]:
        """The dimension labels, in order (a new list on every access)."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """The dimension sizes, in order (a new list on every access)."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        """The number of points in the extent: the product of the sizes (1 for no dims)."""
        return self._nelements

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._index[label]]
        except KeyError:
            raise DimensionNotFoundError(
                f"Dimension {label!r} not found; dimensions are {list(self._labels)}"
            ) from None

    def __contains__(self, label: object) -> bool:
        return label in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        # Monarch's form: ``{hosts: 2, gpus: 4}``, labels quoted only when not identifier-like.
        inner = ", ".join(
            f"{label_key(label)}: {n}" for label, n in zip(self._labels, self._sizes, strict=True)
        )
        return "{" + inner + "}"

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Extent], tuple[list[str], list[int]]]:
        return (Extent, (list(self._labels), list(self._sizes)))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Extent is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Extent is immutable; cannot delete {name!r}")


class Point(Mapping[str, int]):
    """One position in an `Extent`: a read-only mapping from label to coordinate.

    ``rank`` is the position's row-major index in the extent (last dimension fastest)::

        >>> p = Point(1, Extent(["hosts", "gpus"], [1, 2]))
        >>> p
        {'hosts': 0/1, 'gpus': 1/2}
        >>> dict(p), p.rank, p.size("gpus")
        ({'hosts': 0, 'gpus': 1}, 1, 2)

    A point can be splatted into a mesh selection, ``mesh.slice(**point)``. A rank outside
    ``range(extent.nelements)`` raises ``IndexError``. Points are immutable, hashable and
    picklable, and equal when their ranks and extents are equal.
    """

    __slots__ = ("_coords", "_extent", "_rank")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        if not isinstance(extent, Extent):
            raise TypeError(f"Point needs an Extent, got {type(extent).__name__}")
        if isinstance(rank, bool):
            raise TypeError("Point rank must be an int, not bool")
        r = operator.index(rank)
        if not 0 <= r < extent.nelements:
            raise IndexError(f"rank {r} out of range for extent {extent} of {extent.nelements}")
        sizes = extent._sizes
        coords = [0] * len(sizes)
        rest = r
        for dim in range(len(sizes) - 1, -1, -1):
            rest, coords[dim] = divmod(rest, sizes[dim])
        object.__setattr__(self, "_rank", r)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", tuple(coords))

    @property
    def rank(self) -> int:
        """The row-major index of this point within its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point lies in."""
        return self._extent

    def size(self, label: str) -> int:
        """Return the size of dimension ``label`` of the extent."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent._index[label]]
        except KeyError:
            raise DimensionNotFoundError(
                f"Dimension {label!r} not found; dimensions are {list(self._extent._labels)}"
            ) from None

    def __contains__(self, label: object) -> bool:
        return label in self._extent._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __repr__(self) -> str:
        ext = self._extent
        # Monarch puts every label in single quotes as is, without escaping.
        inner = ", ".join(
            f"'{label}': {c}/{n}"
            for label, c, n in zip(ext._labels, self._coords, ext._sizes, strict=True)
        )
        return "{" + inner + "}"

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]:
        return (Point, (self._rank, self._extent))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Point is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Point is immutable; cannot delete {name!r}")
