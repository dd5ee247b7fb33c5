"""Controller-side collective geometry: reduce groups in world ranks, output shapes, and the
send/receive pairs of ``to_mesh``."""

import itertools

import pytest
import torch

from regency._tensor.groups import REDUCTIONS, move_pairs, reduce_groups, reduce_output_size
from regency.shape import DimensionNotFoundError, Extent, Shape, Slice

pytestmark = pytest.mark.timeout(30)


def mesh(**sizes: int) -> Shape:
    return Shape.from_extent(Extent(list(sizes), list(sizes.values())))


def groups_by_slicing(shape: Shape, dims: list[str]) -> list[tuple[int, ...]]:
    """The oracle: fix every other dim with Shape.slice and list the ranks left."""
    others = [d for d in shape.labels if d not in dims]
    fixed = itertools.product(*(range(shape.sizes[d]) for d in others))
    return [tuple(shape.slice(**dict(zip(others, at))).ranks()) for at in fixed]


# -- reduce_groups ------------------------------------------------------------------------


def test_one_dim_is_one_group_in_coordinate_order() -> None:
    assert reduce_groups(mesh(gpus=4), "gpus") == [(0, 1, 2, 3)]
    assert reduce_groups(mesh(gpus=4), ["gpus"]) == [(0, 1, 2, 3)]


def test_two_dims() -> None:
    s = mesh(hosts=2, gpus=3)
    assert reduce_groups(s, "gpus") == [(0, 1, 2), (3, 4, 5)]
    assert reduce_groups(s, "hosts") == [(0, 3), (1, 4), (2, 5)]
    assert reduce_groups(s, ["hosts", "gpus"]) == [(0, 1, 2, 3, 4, 5)]


def test_dim_order_in_the_argument_does_not_change_groups() -> None:
    s = mesh(a=2, b=3, c=2)
    assert reduce_groups(s, ["c", "a"]) == reduce_groups(s, ["a", "c"])


def test_three_dims() -> None:
    s = mesh(a=2, b=3, c=2)
    assert reduce_groups(s, "b") == [(0, 2, 4), (1, 3, 5), (6, 8, 10), (7, 9, 11)]
    assert reduce_groups(s, ["a", "c"]) == [(0, 1, 6, 7), (2, 3, 8, 9), (4, 5, 10, 11)]
    for dims in (["a"], ["b"], ["c"], ["a", "b"], ["b", "c"], ["a", "c"], ["a", "b", "c"]):
        assert reduce_groups(s, dims) == groups_by_slicing(s, dims)


def test_no_dims_means_every_dim() -> None:
    s = mesh(hosts=2, gpus=2)
    assert reduce_groups(s, []) == [(0, 1, 2, 3)]


def test_sliced_view_gives_world_ranks() -> None:
    view = mesh(hosts=2, gpus=4).slice(gpus=slice(1, 4, 2))  # gpus 1 and 3 of each host
    assert view.ranks() == [1, 3, 5, 7]
    assert reduce_groups(view, "gpus") == [(1, 3), (5, 7)]
    assert reduce_groups(view, "hosts") == [(1, 5), (3, 7)]
    assert reduce_groups(view, ["hosts", "gpus"]) == [(1, 3, 5, 7)]


def test_view_with_a_dim_fixed_and_a_strided_slice() -> None:
    view = mesh(a=3, b=2, c=4).slice(a=2, c=slice(0, 4, 3))
    assert view.labels == ["b", "c"]
    assert reduce_groups(view, "c") == [(16, 19), (20, 23)]
    assert reduce_groups(view, "b") == [(16, 20), (19, 23)]
    for dims in (["b"], ["c"], ["b", "c"]):
        assert reduce_groups(view, dims) == groups_by_slicing(view, dims)


def test_explicit_slice_offset_and_strides() -> None:
    s = Shape(["x", "y"], Slice(offset=5, sizes=[2, 2], strides=[10, 2]))
    assert reduce_groups(s, "y") == [(5, 7), (15, 17)]
    assert reduce_groups(s, "x") == [(5, 15), (7, 17)]


def test_single_proc_view() -> None:
    view = mesh(gpus=4).slice(gpus=slice(2, 3))
    assert reduce_groups(view, "gpus") == [(2,)]


def test_unknown_dim_raises_the_shape_error() -> None:
    with pytest.raises(DimensionNotFoundError, match="nope"):
        reduce_groups(mesh(gpus=2), "nope")
    with pytest.raises(KeyError):
        reduce_groups(mesh(gpus=2), ["gpus", "hosts"])
    with pytest.raises(ValueError, match="hosts"):
        reduce_groups(mesh(gpus=2), ["hosts"])


def test_a_dim_twice_raises() -> None:
    with pytest.raises(ValueError, match="twice"):
        reduce_groups(mesh(gpus=2), ["gpus", "gpus"])


# -- reduce_output_size -------------------------------------------------------------------


def test_reductions_are_monarchs() -> None:
    assert REDUCTIONS == ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")


@pytest.mark.parametrize("reduction", [r for r in REDUCTIONS if r != "stack"])
def test_all_reduce_keeps_the_shape(reduction: str) -> None:
    assert reduce_output_size(reduction, False, torch.Size([3, 5]), 4) == torch.Size([3, 5])
    assert reduce_output_size(reduction, False, torch.Size([]), 4) == torch.Size([])


@pytest.mark.parametrize("reduction", [r for r in REDUCTIONS if r != "stack"])
def test_reduce_scatter_drops_the_split_dim(reduction: str) -> None:
    assert reduce_output_size(reduction, True, torch.Size([4, 3, 5]), 4) == torch.Size([3, 5])
    assert reduce_output_size(reduction, True, torch.Size([4]), 4) == torch.Size([])


def test_stack_adds_a_leading_dim() -> None:
    assert reduce_output_size("stack", False, torch.Size([3, 5]), 4) == torch.Size([4, 3, 5])
    assert reduce_output_size("stack", False, torch.Size([]), 2) == torch.Size([2])


def test_stack_scatter_is_all_to_all_and_keeps_the_shape() -> None:
    assert reduce_output_size("stack", True, torch.Size([4, 3]), 4) == torch.Size([4, 3])


def test_results_are_torch_sizes() -> None:
    for reduction, scatter in itertools.product(REDUCTIONS, (False, True)):
        out = reduce_output_size(reduction, scatter, torch.Size([2, 2]), 2)
        assert isinstance(out, torch.Size)


def test_unknown_reduction_raises() -> None:
    with pytest.raises(ValueError, match="'mean' not supported"):
        reduce_output_size("mean", False, torch.Size([2]), 2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("size", [[3, 2], [8], [2, 4], []])
def test_scatter_needs_a_leading_dim_of_the_group_size(reduction: str, size: list[int]) -> None:
    with pytest.raises(ValueError, match="must be 4"):
        reduce_output_size(reduction, True, torch.Size(size), 4)


# -- move_pairs ---------------------------------------------------------------------------


def test_between_two_slices_pairs_equal_coordinates() -> None:
    s = mesh(hosts=2, gpus=3)
    assert move_pairs(s.slice(hosts=0), s.slice(hosts=1)) == ((0, 3), (1, 4), (2, 5))
    assert move_pairs(s.slice(gpus=2), s.slice(gpus=0)) == ((2, 0), (5, 3))


def test_to_its_own_shape_every_proc_keeps_its_shard() -> None:
    s = mesh(hosts=2, gpus=2)
    assert move_pairs(s, s) == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_dims_match_by_name_not_position() -> None:
    s = mesh(hosts=2, gpus=2)
    # The same procs with the dims listed the other way round: rank 1 is gpus=1, hosts=0.
    swapped = Shape(["gpus", "hosts"], Slice(0, [2, 2], [1, 2]))
    assert move_pairs(s, swapped) == ((0, 0), (2, 2), (1, 1), (3, 3))
    transposed = Shape(["gpus", "hosts"], Slice(0, [2, 2], [2, 1]))
    assert move_pairs(s, transposed) == ((0, 0), (2, 1), (1, 2), (3, 3))


def test_a_dim_only_the_destination_has_is_a_broadcast() -> None:
    s = mesh(hosts=2, gpus=2)
    assert move_pairs(s.slice(hosts=1), s) == ((2, 0), (3, 1), (2, 2), (3, 3))
    assert move_pairs(s.slice(hosts=0, gpus=1), s) == ((1, 0), (1, 1), (1, 2), (1, 3))


def test_a_shift_pairs_overlapping_ranges() -> None:
    s = mesh(r=4)
    assert move_pairs(s.slice(r=slice(0, 3)), s.slice(r=slice(1, 4))) == ((0, 1), (1, 2), (2, 3))


def test_mismatched_dims_raise_naming_them() -> None:
    s = mesh(hosts=2, gpus=2)
    with pytest.raises(ValueError, match=r"does not have the dimensions \['hosts'\]"):
        move_pairs(s, s.slice(hosts=0))
    with pytest.raises(ValueError, match="dimension 'gpus' has size 1 in the destination"):
        move_pairs(s.slice(hosts=0), s.slice(hosts=1, gpus=slice(1, 2)))
    with pytest.raises(ValueError, match=r"\['gpus', 'hosts'\]"):
        move_pairs(s, mesh(r=4))
