"""ValueMesh built directly and MeshTrait on it (monarch-api.md §1.1 "ValueMesh", "MeshTrait")."""

from __future__ import annotations

import pickle

import pytest
from compat_impl import Shape, Slice, actor

ValueMesh = actor.ValueMesh


@pytest.fixture
def vm() -> actor.ValueMesh:
    return ValueMesh(Shape(["x", "y"], Slice.new_row_major([2, 3])), list("abcdef"))


def test_valuemesh_str(vm):
    assert str(vm) == (
        "ValueMesh({x: 2, y: 3}):\n"
        "  (({'x': 0/2, 'y': 0/3}, 'a'),\n"
        "   ({'x': 0/2, 'y': 1/3}, 'b'),\n"
        "   ({'x': 0/2, 'y': 2/3}, 'c'),\n"
        "   ({'x': 1/2, 'y': 0/3}, 'd'),\n"
        "   ({'x': 1/2, 'y': 1/3}, 'e'),\n"
        "   ({'x': 1/2, 'y': 2/3}, 'f'))"
    )
    assert repr(vm) == str(vm)


def test_valuemesh_short_str_is_one_line(vm):
    assert str(vm.slice(x=1)) == (
        "ValueMesh({y: 3}):\n  (({'y': 0/3}, 'd'), ({'y': 1/3}, 'e'), ({'y': 2/3}, 'f'))"
    )


def test_valuemesh_sizes_extent_len(vm):
    assert vm.sizes == {"x": 2, "y": 3}
    assert vm.extent == actor.Extent(["x", "y"], [2, 3])
    assert len(vm) == 6


def test_valuemesh_size(vm):
    assert vm.size() == 6
    assert vm.size("x") == 2
    assert vm.size(["x", "y"]) == 6


def test_valuemesh_size_unknown_dim_is_key_error(vm):
    with pytest.raises(KeyError):
        vm.size("z")


def test_valuemesh_values_items_iteration_in_rank_order(vm):
    assert list(vm.values()) == list("abcdef")
    items = [(str(p), v) for p, v in vm.items()]
    assert items[0] == ("{'x': 0/2, 'y': 0/3}", "a")
    assert items[5] == ("{'x': 1/2, 'y': 2/3}", "f")
    assert [(str(p), v) for p, v in vm] == items


def test_valuemesh_item(vm):
    assert vm.item(x=1, y=2) == "f"
    assert vm.item(x=0, y=1) == "b"


def test_valuemesh_item_missing_dim_is_key_error(vm):
    with pytest.raises(KeyError, match="y"):
        vm.item(x=1)


def test_valuemesh_item_extra_dim_is_key_error(vm):
    with pytest.raises(KeyError, match=r"item has extra dimensions: \['z'\]"):
        vm.item(x=1, y=2, z=0)


def test_valuemesh_item_out_of_range_is_index_error(vm):
    with pytest.raises(IndexError):
        vm.item(x=5, y=0)


def test_valuemesh_item_on_singleton_takes_no_coords(vm):
    assert vm.slice(x=1).slice(y=0).item() == "d"


def test_valuemesh_get_by_local_index(vm):
    assert vm.get(4) == "e"


def test_valuemesh_slice_int_removes_dim(vm):
    sub = vm.slice(x=1)
    assert sub.sizes == {"y": 3}
    assert list(sub.values()) == ["d", "e", "f"]


def test_valuemesh_slice_range_keeps_dim(vm):
    sub = vm.slice(y=slice(1, 3))
    assert sub.sizes == {"x": 2, "y": 2}
    assert list(sub.values()) == ["b", "c", "e", "f"]
    assert list(vm.slice(y=slice(-2, None)).values()) == ["b", "c", "e", "f"]


def test_valuemesh_slice_unknown_dim_is_type_error(vm):
    with pytest.raises(TypeError, match="Shape does not have dimension labeled 'z'"):
        vm.slice(z=0)


@pytest.mark.parametrize("index", [2, 7, -1])
def test_valuemesh_slice_out_of_range_is_index_error(vm, index):
    with pytest.raises(IndexError, match="index out of range"):
        vm.slice(x=index)


def test_valuemesh_flatten(vm):
    flat = vm.flatten("r")
    assert flat.sizes == {"r": 6}
    assert list(flat.values()) == list("abcdef")
    assert flat.slice(r=0).item() == "a"


def test_valuemesh_rename(vm):
    assert vm.rename(x="a").sizes == {"a": 2, "y": 3}
    assert vm.rename(x="a").item(a=1, y=0) == "d"


def test_valuemesh_rename_to_existing_is_value_error(vm):
    with pytest.raises(ValueError, match="Duplicate dimension name 'y'"):
        vm.rename(x="y")


def test_valuemesh_rename_unknown_is_value_error(vm):
    with pytest.raises(ValueError):
        vm.rename(z="w")


def test_valuemesh_split(vm):
    sp = vm.split(y=("p", "q"), q=3)
    assert sp.sizes == {"x": 2, "p": 1, "q": 3}
    assert sp.item(x=1, p=0, q=2) == "f"


def test_valuemesh_split_non_divisible_is_value_error(vm):
    with pytest.raises(ValueError, match="not evenly divided"):
        vm.split(y=("p", "q"), q=2)


def test_valuemesh_pickles(vm):
    back = pickle.loads(pickle.dumps(vm))
    assert back.item(x=0, y=1) == "b"
    assert back.sizes == vm.sizes


def test_valuemesh_wrong_number_of_values_is_value_error():
    with pytest.raises(ValueError):
        ValueMesh(Shape(["x"], Slice.new_row_major([3])), [1, 2])


def test_valuemesh_from_indexed():
    shape = Shape(["x", "y"], Slice.new_row_major([2, 3]))
    vm = ValueMesh.from_indexed(shape, [(i, i * 10) for i in reversed(range(6))])
    assert vm.item(x=1, y=1) == 40
    assert list(vm.values()) == [0, 10, 20, 30, 40, 50]


def test_valuemesh_from_indexed_missing_rank_is_value_error():
    shape = Shape(["x"], Slice.new_row_major([3]))
    with pytest.raises(ValueError):
        ValueMesh.from_indexed(shape, [(0, "a"), (1, "b")])


def test_valuemesh_from_indexed_duplicate_last_wins():
    shape = Shape(["x"], Slice.new_row_major([2]))
    vm = ValueMesh.from_indexed(shape, [(0, "a"), (1, "b"), (0, "z")])
    assert list(vm.values()) == ["z", "b"]
