"""The mesh operations of Monarch's ``MeshTrait``, on (labels, `Slice`) pairs.

`Shape` wraps these; every mesh type delegates to its `Shape`. Each function takes the
labels and slice of a shape plus a ``describe`` string naming it in error messages, and
returns the labels and slice of the result. Nothing here copies or enumerates ranks.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

from ._errors import DimensionNotFoundError
from ._slice import Slice, _row_major_strides

Labelled = tuple[tuple[str, ...], Slice]


def _index_value(value: object, label: str, size: int) -> int:
    """Validate an integer index ``value`` for dimension ``label`` of ``size``."""
    if isinstance(value, bool):
        raise TypeError(f"cannot index dimension {label!r} with a bool")
    try:
        index = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"dimension {label!r} must be selected with an int, slice or range, "
            f"not {type(value).__name__}"
        ) from None
    if not 0 <= index < size:
        raise IndexError(
            f"index out of range: index {index} for dimension {label!r} of size {size}"
        )
    return index


def _range_of(value: slice | range, label: str, size: int) -> range:
    """Resolve a slice or range against ``size`` with Python's semantics; step must be > 0."""
    if isinstance(value, range):
        value = slice(value.start, value.stop, value.step)
    if value.step is not None and operator.index(value.step) <= 0:
        raise ValueError(f"slice step for dimension {label!r} must be > 0, got {value.step}")
    return range(*value.indices(size))


def slice_dims(
    labels: tuple[str, ...], ndslice: Slice, dims: Mapping[str, object], describe: str
) -> Labelled:
    """Select along named dimensions: an int removes the dim, a slice/range restricts it."""
    unknown = [name for name in dims if name not in labels]
    if unknown:
        # Monarch's text names the first unknown label; the others and what there is follow.
        others = f" (nor {tuple(unknown[1:])})" if len(unknown) > 1 else ""
        raise TypeError(
            f"Shape does not have dimension labeled {unknown[0]!r}{others}; "
            f"{describe} has dimensions {labels}"
        )
    offset = ndslice.offset
    names: list[str] = []
    sizes: list[int] = []
    strides: list[int] = []
    for name, size, stride in zip(labels, ndslice.sizes, ndslice.strides, strict=True):
        if name not in dims:
            names.append(name)
            sizes.append(size)
            strides.append(stride)
            continue
        value = dims[name]
        if isinstance(value, (slice, range)):
            selected = _range_of(value, name, size)
            offset += selected.start * stride
            names.append(name)
            sizes.append(len(selected))
            strides.append(selected.step * stride)
        else:
            offset += _index_value(value, name, size) * stride
    return tuple(names), Slice(offset, sizes, strides)


def is_dense(ndslice: Slice) -> bool:
    """Whether the slice's ranks are one contiguous run in row-major order."""
    sizes = ndslice.sizes
    if 0 in sizes:
        return True
    moving = [(n, s) for n, s in zip(sizes, ndslice.strides, strict=True) if n != 1]
    expected = _row_major_strides([n for n, _ in moving])
    return all(s == e for (_, s), e in zip(moving, expected, strict=True))


def flatten(labels: tuple[str, ...], ndslice: Slice, name: str, describe: str) -> Labelled:
    """Collapse every dimension into one named ``name``; only for dense slices."""
    if not isinstance(name, str):
        raise TypeError(f"flatten() needs a str dimension name, got {type(name).__name__}")
    if not is_dense(ndslice):
        dense = list(_row_major_strides(ndslice.sizes))
        raise ValueError(
            f"cannot flatten sparse mesh: ndslice.strides={ndslice.strides} "
            f"!= dense_strides={dense} ({describe})"
        )
    return (name,), Slice(ndslice.offset, [len(ndslice)], [1])


def rename(
    labels: tuple[str, ...], ndslice: Slice, mapping: Mapping[str, str], describe: str
) -> Labelled:
    """Rename dimensions ``old=new``; unknown old labels and clashes raise ``ValueError``."""
    unknown = [old for old in mapping if old not in labels]
    if unknown:
        raise ValueError(
            f"{describe} does not have dimension(s) named {tuple(unknown)}; "
            f"its dimensions are {labels}"
        )
    for old, new in mapping.items():
        if not isinstance(new, str):
            raise TypeError(f"new name for dimension {old!r} must be a str, got {new!r}")
    names = tuple(mapping.get(label, label) for label in labels)
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(
            f"Duplicate dimension name {dups[0]!r}: renaming {describe} gives duplicate "
            f"dimension names {dups}"
        )
    return names, ndslice


def split(
    labels: tuple[str, ...], ndslice: Slice, kwargs: Mapping[str, object], describe: str
) -> Labelled:
    """Split dimensions into several, Monarch style.

    A keyword naming an existing dimension maps to the sequence of new names it splits
    into (row-major); any other keyword gives the size of one of those new names. At most
    one size per split may be left out, and is inferred.
    """
    splits: dict[str, tuple[str, ...]] = {}
    constraints: dict[str, int] = {}
    for key, value in kwargs.items():
        if key in labels:
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise ValueError(
                    f"dimension {key!r} of {describe} must be split into a sequence of "
                    f"new dimension names, got {value!r}"
                )
            names = tuple(value)
            if not names or not all(isinstance(n, str) for n in names):
                raise ValueError(
                    f"dimension {key!r} must be split into one or more str names, got {value!r}"
                )
            splits[key] = names
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{key!r} is not an existing dim of {describe}. Expected an integer "
                    f"size constraint on a new dim, got {value!r}"
                )
            if value <= 0:
                raise ValueError(f"size of new dim {key!r} must be > 0, got {value}")
            constraints[key] = value

    out_names: list[str] = []
    out_sizes: list[int] = []
    out_strides: list[int] = []
    for name, size, stride in zip(labels, ndslice.sizes, ndslice.strides, strict=True):
        to_names = splits.get(name, (name,))
        for to_name in to_names:
            if to_name in out_names or to_names.count(to_name) > 1:
                raise ValueError(f"Duplicate dimension name {to_name!r}")
            out_names.append(to_name)
        known = 1
        unknown_name: str | None = None
        for to_name in to_names:
            if to_name in constraints:
                known *= constraints[to_name]
            elif unknown_name is None:
                unknown_name = to_name
            else:
                raise ValueError(
                    f"Cannot infer size of {to_names} because both {unknown_name!r} and "
                    f"{to_name!r} have unknown size. Specify at least one as argument, "
                    f"e.g. {to_name}=4"
                )
        if unknown_name is not None:
            inferred, rest = divmod(size, known)
            if rest:
                given = tuple(constraints.get(n, "?") for n in to_names)
                raise ValueError(
                    f"Dimension {name!r} of size {size} is not evenly divided by "
                    f"{to_names!r} with sizes {given!r}"
                )
            constraints[unknown_name] = inferred
        elif known != size:
            given = tuple(constraints[n] for n in to_names)
            raise ValueError(
                f"Dimension {name!r} of size {size} is not evenly divided by "
                f"{to_names!r} with sizes {given!r}"
            )
        new_sizes = [constraints.pop(n) for n in to_names]
        acc = stride
        new_strides = [0] * len(new_sizes)
        for i in range(len(new_sizes) - 1, -1, -1):
            new_strides[i] = acc
            acc *= new_sizes[i]
        out_sizes.extend(new_sizes)
        out_strides.extend(new_strides)
    if constraints:
        raise ValueError(
            f"unused size constraints {tuple(constraints)}: they name no dimension "
            f"produced by the split of {describe}"
        )
    return tuple(out_names), Slice(ndslice.offset, out_sizes, out_strides)


def size_of(
    labels: tuple[str, ...], ndslice: Slice, dim: str | Sequence[str] | None, describe: str
) -> int:
    """Total size, one dimension's size, or the product over several dimensions."""
    if dim is None:
        return len(ndslice)
    if isinstance(dim, str):
        if dim not in labels:
            raise DimensionNotFoundError(f"{describe} does not have dimension {dim!r}")
        return ndslice.sizes[labels.index(dim)]
    total = 1
    for d in dim:
        total *= size_of(labels, ndslice, d, describe)
    return total
