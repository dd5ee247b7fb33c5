"""Controller-side geometry of collectives: which procs reduce together, the result's shape,
and which proc sends to which in a ``to_mesh``.

Both are pure functions of the mesh view and the tensor's metadata, so the controller knows a
reduction's groups and output shape without asking a worker, and rejects a bad call before
anything is sent.

Monarch's semantics (``monarch.common.tensor.Tensor.reduce`` and its worker's ``_reduce``):

============================  ============================  ================================
reduction, scatter            torch.distributed call        output shape (input ``(N, *r)``)
============================  ============================  ================================
``stack``, False              ``all_gather_into_tensor``    ``(group_size, N, *r)``
``stack``, True               ``all_to_all_single``         ``(N, *r)``, ``N == group_size``
other, False                  ``all_reduce``                ``(N, *r)``
other, True                   ``reduce_scatter_tensor``     ``r``, ``N == group_size``
============================  ============================  ================================
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from regency.shape import Shape

REDUCTIONS: tuple[str, ...] = (
    "stack",
    "sum",
    "avg",
    "product",
    "min",
    "max",
    "band",
    "bor",
    "bxor",
)


def _dims_tuple(shape: Shape, dims: str | Sequence[str]) -> tuple[str, ...]:
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if len(set(names)) != len(names):
        raise ValueError(f"reducing the same dimension twice: {list(names)}")
    for name in names:
        shape.size(name)  # an unknown label raises the shape's DimensionNotFoundError
    # Monarch reads no dims as every dim of the mesh.
    return names or tuple(shape.labels)


def reduce_groups(shape: Shape, dims: str | Sequence[str]) -> list[tuple[int, ...]]:
    """Partition the procs of ``shape`` into the groups that reduce together over ``dims``.

    A group holds the procs that differ only in their coordinates along ``dims``; the other
    dims are fixed per group. Entries are world ranks, the ranks of the procs in the root
    mesh (the view's slice offset and strides applied to its coordinates). Each group is
    ordered row-major by the coordinates along ``dims`` taken in the mesh's dim order, so
    ``["hosts", "gpus"]`` and ``["gpus", "hosts"]`` give the same groups; group rank ``i`` is
    the proc at coordinate ``i`` along a single dim, which ``stack`` relies on. The groups
    come in row-major order of the fixed dims. ``dims`` may be one label or a sequence; an
    empty sequence means every dim, as in Monarch.

    An unknown label raises `regency.shape.DimensionNotFoundError` (a ``KeyError`` and a
    ``ValueError``); a label given twice raises ``ValueError``.
    """
    reduced = set(_dims_tuple(shape, dims))
    ndslice = shape.ndslice
    inner = [i for i, label in enumerate(shape.labels) if label in reduced]
    outer = [i for i, label in enumerate(shape.labels) if label not in reduced]
    sizes, strides = ndslice.sizes, ndslice.strides

    def offsets(axes: list[int]) -> list[int]:
        ranges = [range(0, sizes[a] * strides[a], strides[a]) for a in axes]
        return [sum(combo) for combo in itertools.product(*ranges)]

    within = offsets(inner)
    return [tuple(ndslice.offset + base + step for step in within) for base in offsets(outer)]


def reduce_output_size(
    reduction: str, scatter: bool, size: torch.Size, group_size: int
) -> torch.Size:
    """Return the shape each rank gets from reducing a tensor of ``size`` over ``group_size`` procs.

    ``stack`` adds a leading dim of ``group_size``; a scatter splits the leading dim, which must
    equal ``group_size``, across the group (``stack`` then keeps the input's shape, the others
    drop that dim); the other reductions keep the shape. An unknown reduction, or a scatter of
    a tensor without a leading dim of ``group_size``, raises ``ValueError``.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction {reduction!r} not supported, reductions are {REDUCTIONS}")
    if scatter:
        if len(size) == 0 or size[0] != group_size:
            raise ValueError(
                f"scatter splits the outermost dim of the tensor across the {group_size} procs"
                f" reducing, so it must be {group_size}; the tensor has size {list(size)}"
            )
        return size if reduction == "stack" else torch.Size(size[1:])
    if reduction == "stack":
        return torch.Size([group_size, *size])
    return size


def move_pairs(source: Shape, dest: Shape) -> tuple[tuple[int, int], ...]:
    """The ``(source rank, destination rank)`` pairs (world ranks) of a ``to_mesh`` from the
    procs of ``source`` to those of ``dest``, one per destination proc in row-major order.

    Dimensions match by name, as in Monarch's ``to_mesh``: the destination proc at some
    coordinates gets the shard of the source proc at the same coordinates along the source's
    dims. A destination dim the source lacks is a broadcast (every proc along it gets the same
    shard); a source dim of another size, or one the destination lacks, raises ``ValueError``
    naming it.
    """
    dest_sizes = dest.sizes
    for name, size in source.sizes.items():
        if name not in dest_sizes:
            missing = sorted(set(source.labels) - set(dest.labels))
            raise ValueError(f"the destination mesh does not have the dimensions {missing}")
        if dest_sizes[name] != size:
            raise ValueError(
                f"dimension {name!r} has size {dest_sizes[name]} in the destination mesh but"
                f" {size} in the source"
            )
    pairs = []
    for rank in dest.ranks():
        at = dest.coordinates(rank)
        (src,) = source.index(**{name: at[name] for name in source.labels}).ranks()
        pairs.append((src, rank))
    return tuple(pairs)
