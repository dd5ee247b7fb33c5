"""`Slice`: an N-dimensional strided view over flat base ranks (Monarch's ``ndslice``)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import NoReturn, overload


def _as_count(value: object, what: str) -> int:
    """Return ``value`` as a non-negative ``int``, or raise ``ValueError``/``TypeError``."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    number = operator.index(value)  # type: ignore[arg-type]
    if number < 0:
        raise ValueError(f"{what} must be >= 0, got {number}")
    return number


def _row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense row-major layout of ``sizes``."""
    strides = [1] * len(sizes)
    acc = 1
    for dim in range(len(sizes) - 1, -1, -1):
        strides[dim] = acc
        acc *= sizes[dim]
    return tuple(strides)


class Slice:
    """A strided N-dimensional view onto a flat space of *base ranks*.

    A coordinate ``(c_0, ..., c_{n-1})`` maps to the base rank
    ``offset + sum(c_i * strides[i])``. Elements are ordered row-major: ``slice[i]`` is the
    base rank of the ``i``-th coordinate when the last dimension varies fastest, whatever
    the strides. Slices are immutable, hashable and picklable.

    Example::

        >>> s = Slice(offset=1, sizes=[2, 2], strides=[3, 1])
        >>> list(s)
        [1, 2, 4, 5]
        >>> s.index(4), s.coordinates(4), s.nditem([1, 0])
        (2, [1, 0], 4)

    The layout must not overlap: ordering the dimensions of size > 1 by stride, each stride
    must exceed the span of all smaller-strided dimensions. This makes every element's base
    rank distinct, so `index` and `coordinates` are well defined; every slice obtained from a
    valid one by `Shape` operations satisfies it. A violation raises ``ValueError``.
    """

    __slots__ = ("_hash", "_len", "_offset", "_order", "_sizes", "_strides")

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _len: int
    _order: tuple[int, ...]
    _hash: int

    def __init__(self, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        off = _as_count(offset, "offset")
        sz = tuple(_as_count(n, "size") for n in sizes)
        st = tuple(_as_count(n, "stride") for n in strides)
        if len(sz) != len(st):
            raise ValueError(
                f"sizes and strides must have the same length: {len(sz)} sizes, {len(st)} strides"
            )
        total = 1
        for n in sz:
            total *= n
        # Dimensions that actually move through the base ranks, largest stride first.
        order = tuple(sorted((d for d in range(len(sz)) if sz[d] > 1), key=lambda d: -st[d]))
        if total:
            span = 0
            for dim in reversed(order):
                if st[dim] <= span:
                    raise ValueError(
                        f"overlapping layout: stride {st[dim]} of dimension {dim} must exceed "
                        f"{span}, the span of the dimensions with smaller strides "
                        f"(sizes={list(sz)}, strides={list(st)})"
                    )
                span += (sz[dim] - 1) * st[dim]
        object.__setattr__(self, "_offset", off)
        object.__setattr__(self, "_sizes", sz)
        object.__setattr__(self, "_strides", st)
        object.__setattr__(self, "_len", total)
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_hash", hash((off, sz, st)))

    # -- construction -----------------------------------------------------------------

    @staticmethod
    def new_row_major(sizes: Sequence[int]) -> Slice:
        """Return the dense row-major slice of ``sizes`` at offset 0.

        ``Slice.new_row_major([2, 3])`` is ``Slice { offset: 0, sizes: [2, 3], strides: [3, 1] }``.
        """
        sz = [_as_count(n, "size") for n in sizes]
        return Slice(0, sz, _row_major_strides(sz))

    @staticmethod
    def from_list(ranks: Sequence[int]) -> Slice:
        """Return the slice whose row-major elements are exactly ``ranks``, in that order.

        The ranks must form a regular strided pattern, for example ``[1, 2, 4, 5]`` gives
        ``Slice { offset: 1, sizes: [2, 2], strides: [3, 1] }``; contiguous runs are merged
        into one dimension. Raises ``ValueError`` for an empty list, repeated ranks or ranks
        that no slice enumerates in this order.
        """
        values = [_as_count(r, "rank") for r in ranks]
        if not values:
            raise ValueError("cannot build a Slice from an empty list of ranks")
        sizes: list[int] = []
        strides: list[int] = []
        # Peel dimensions innermost first: each pass finds the longest arithmetic run at the
        # front, checks that the whole list is made of such runs, and keeps only run starts.
        while len(values) > 1:
            step = values[1] - values[0]
            if step <= 0:
                raise ValueError(
                    f"ranks do not form a strided slice: {values[1]} follows {values[0]}"
                )
            run = 2
            while run < len(values) and values[run] - values[run - 1] == step:
                run += 1
            if len(values) % run:
                raise ValueError(
                    f"ranks do not form a strided slice: {len(values)} ranks are not a "
                    f"whole number of runs of {run}"
                )
            for start in range(0, len(values), run):
                base = values[start]
                for i in range(1, run):
                    if values[start + i] != base + i * step:
                        raise ValueError(
                            f"ranks do not form a strided slice: expected "
                            f"{base + i * step} at position {start + i}, "
                            f"got {values[start + i]}"
                        )
            sizes.append(run)
            strides.append(step)
            values = values[::run]
        if not sizes:
            return Slice(values[0], [1], [1])
        return Slice(values[0], sizes[::-1], strides[::-1])

    # -- properties -------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """The base rank of the first element (all coordinates zero)."""
        return self._offset

    @property
    def sizes(self) -> list[int]:
        """The size of each dimension (a new list on every access)."""
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        """The stride of each dimension in base ranks (a new list on every access)."""
        return list(self._strides)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._sizes)

    # -- mapping between positions, coordinates and base ranks ------------------------

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        """Return the base rank at row-major position ``index`` (a tuple for a slice)."""
        if isinstance(index, slice):
            return tuple(self._at(i) for i in range(*index.indices(self._len)))
        i = operator.index(index)
        if i < 0:
            raise TypeError(f"Slice index must be non-negative, got {i}")
        if i >= self._len:
            raise IndexError(f"index {i} out of range {self._len}")
        return self._at(i)

    def _at(self, i: int) -> int:
        sizes = self._sizes
        if len(sizes) == 1:
            return self._offset + i * self._strides[0]
        rank = self._offset
        for dim in range(len(sizes) - 1, -1, -1):
            i, c = divmod(i, sizes[dim])
            rank += c * self._strides[dim]
        return rank

    def __iter__(self) -> Iterator[int]:
        """Yield the base ranks in row-major order, lazily."""
        if self._len == 0:
            return iter(())
        sizes, strides, offset = self._sizes, self._strides, self._offset
        if not sizes:
            return iter((offset,))
        if len(sizes) == 1:
            if sizes[0] == 1:
                return iter((offset,))
            return iter(range(offset, offset + sizes[0] * strides[0], strides[0]))
        return self._iter_nd()

    def _iter_nd(self) -> Iterator[int]:
        sizes, strides = self._sizes, self._strides
        axes = [
            range(0, n * s, s) if s > 0 else (0,) * n
            for n, s in zip(sizes[:-1], strides[:-1], strict=True)
        ]
        last_n, last_s = sizes[-1], strides[-1]
        for parts in itertools.product(*axes):
            base = self._offset + sum(parts)
            if last_n == 1:
                yield base
            else:
                yield from range(base, base + last_n * last_s, last_s)

    def coordinates(self, value: int) -> list[int]:
        """Return the coordinates of base rank ``value``; ``ValueError`` if it is absent."""
        pos = operator.index(value) - self._offset
        coords = [0] * len(self._sizes)
        if self._len == 0 or pos < 0:
            raise ValueError(f"value {value} not in slice")
        for dim in self._order:
            c, pos = divmod(pos, self._strides[dim])
            if c >= self._sizes[dim]:
                raise ValueError(f"value {value} not in slice")
            coords[dim] = c
        if pos:
            raise ValueError(f"value {value} not in slice")
        return coords

    def index(self, value: int) -> int:
        """Return the row-major position of base rank ``value``; ``ValueError`` if absent.

        This is the inverse of ``__getitem__``: ``s.index(s[i]) == i``.
        """
        sizes = self._sizes
        if len(sizes) == 1 and self._len > 1:
            pos = operator.index(value) - self._offset
            i, rest = divmod(pos, self._strides[0])
            if pos < 0 or rest or i >= sizes[0]:
                raise ValueError(f"value {value} not in slice")
            return i
        result = 0
        for c, n in zip(self.coordinates(value), sizes, strict=True):
            result = result * n + c
        return result

    def nditem(self, coordinates: Sequence[int]) -> int:
        """Return the base rank at ``coordinates``.

        Raises ``ValueError`` for the wrong number of coordinates and ``IndexError`` for a
        coordinate outside its dimension.
        """
        coords = [operator.index(c) for c in coordinates]
        if len(coords) != len(self._sizes):
            raise ValueError(
                f"invalid dims: expected {len(self._sizes)} coordinates, got {len(coords)}"
            )
        rank = self._offset
        for dim, c in enumerate(coords):
            if not 0 <= c < self._sizes[dim]:
                raise IndexError(
                    f"coordinate {c} out of range for dimension {dim} of size {self._sizes[dim]}"
                )
            rank += c * self._strides[dim]
        return rank

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        try:
            self.coordinates(value)
        except ValueError:
            return False
        return True

    # -- value semantics --------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (
            self._offset == other._offset
            and self._sizes == other._sizes
            and self._strides == other._strides
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (
            f"Slice {{ offset: {self._offset}, sizes: {list(self._sizes)}, "
            f"strides: {list(self._strides)} }}"
        )

    __str__ = __repr__

    def __reduce__(self) -> tuple[type[Slice], tuple[int, list[int], list[int]]]:
        return (Slice, (self._offset, list(self._sizes), list(self._strides)))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Slice is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Slice is immutable; cannot delete {name!r}")
