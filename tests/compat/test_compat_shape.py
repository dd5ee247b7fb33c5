"""Extent, Point, Shape and Slice (monarch-api.md §1.1 "Context & identity", §2.6): pure data."""

from __future__ import annotations

import pickle

import pytest
from compat_impl import Shape, Slice, actor

Extent = actor.Extent
Point = actor.Point


@pytest.fixture
def ext() -> actor.Extent:
    return Extent(["a", "b"], [3, 4])


@pytest.fixture
def shape() -> Shape:
    return Shape(["x", "y"], Slice(offset=0, sizes=[2, 3], strides=[3, 1]))


# --- Extent -------------------------------------------------------------------------------


def test_extent_str_and_repr(ext):
    assert str(ext) == "{a: 3, b: 4}"
    assert repr(ext) == "{a: 3, b: 4}"


def test_extent_empty_str():
    assert str(Extent([], [])) == "{}"


def test_extent_labels_sizes_nelements(ext):
    assert list(ext.labels) == ["a", "b"]
    assert list(ext.sizes) == [3, 4]
    assert ext.nelements == 12


def test_extent_is_a_mapping_of_label_to_size(ext):
    assert len(ext) == 2
    assert ext["a"] == 3
    assert list(ext) == ["a", "b"]
    assert dict(ext) == {"a": 3, "b": 4}
    assert "a" in ext
    assert "z" not in ext
    assert list(ext.keys()) == ["a", "b"]


def test_extent_unknown_label_is_value_error(ext):
    with pytest.raises(ValueError, match="Dimension 'z' not found"):
        ext["z"]


def test_extent_label_size_mismatch():
    with pytest.raises(ValueError):
        Extent(["a", "b"], [1])


def test_extent_equality(ext):
    assert ext == Extent(["a", "b"], [3, 4])
    assert ext != Extent(["a", "b"], [3, 5])


def test_extent_pickles(ext):
    back = pickle.loads(pickle.dumps(ext))
    assert back == ext
    assert str(back) == "{a: 3, b: 4}"


def test_extent_zero_size_dimension():
    assert str(Extent(["a"], [0])) == "{a: 0}"
    assert Extent(["a"], [0]).nelements == 0


@pytest.mark.deviation("regency's Extent is hashable and has no .region", skip="regency")
def test_extent_unhashable_with_region(ext):
    with pytest.raises(TypeError, match="unhashable"):
        hash(ext)
    assert ext.region is not None


# --- Point --------------------------------------------------------------------------------


def test_point_str_and_repr(ext):
    p = Point(5, ext)
    assert str(p) == "{'a': 1/3, 'b': 1/4}"
    assert repr(p) == "{'a': 1/3, 'b': 1/4}"


def test_point_rank_and_extent(ext):
    p = Point(5, ext)
    assert p.rank == 5
    assert p.extent == ext
    assert p.size("a") == 3


def test_point_is_a_mapping_of_label_to_index(ext):
    p = Point(5, ext)
    assert p["a"] == 1
    assert p["b"] == 1
    assert dict(p) == {"a": 1, "b": 1}
    assert list(p) == ["a", "b"]
    assert len(p) == 2


@pytest.mark.parametrize(
    ("rank", "coords"),
    [(0, {"a": 0, "b": 0}), (3, {"a": 0, "b": 3}), (4, {"a": 1, "b": 0}), (11, {"a": 2, "b": 3})],
)
def test_point_row_major_coordinates(ext, rank, coords):
    assert dict(Point(rank, ext)) == coords


def test_point_unknown_label(ext):
    with pytest.raises(ValueError, match="Dimension 'z' not found"):
        Point(5, ext)["z"]


def test_point_of_empty_extent():
    p = Point(0, Extent([], []))
    assert str(p) == "{}"
    assert dict(p) == {}


def test_point_equality_and_pickle(ext):
    p = Point(7, ext)
    assert p == Point(7, ext)
    assert p != Point(6, ext)
    back = pickle.loads(pickle.dumps(p))
    assert back == p
    assert str(back) == "{'a': 1/3, 'b': 3/4}"


# --- Slice --------------------------------------------------------------------------------


def test_slice_repr_and_str():
    s = Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    text = "Slice { offset: 0, sizes: [2, 3], strides: [3, 1] }"
    assert repr(s) == text
    assert str(s) == text


def test_slice_attributes():
    s = Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert list(s.sizes) == [2, 3]
    assert list(s.strides) == [3, 1]
    assert s.offset == 0
    assert s.ndim == 2
    assert len(s) == 6


def test_slice_iterates_ranks():
    assert list(Slice(offset=0, sizes=[2, 3], strides=[3, 1])) == [0, 1, 2, 3, 4, 5]
    assert list(Slice(offset=1, sizes=[2], strides=[2])) == [1, 3]


def test_slice_getitem_index_coordinates():
    s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
    assert list(s) == [1, 3, 5, 7]
    assert s[2] == 5
    assert s.index(5) == 2
    assert list(s.coordinates(5)) == [1, 0]


def test_slice_new_row_major_equals_explicit():
    assert Slice.new_row_major([2, 3]) == Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert Slice.new_row_major([2, 3]) != Slice.new_row_major([3, 2])


def test_slice_pickles():
    s = Slice(offset=2, sizes=[2], strides=[3])
    assert pickle.loads(pickle.dumps(s)) == s


# --- Shape --------------------------------------------------------------------------------


def test_shape_repr_and_str(shape):
    assert str(shape) == "{x=2,y=3}"
    assert repr(shape) == (
        'Shape { labels: ["x", "y"], slice: Slice { offset: 0, sizes: [2, 3], strides: [3, 1] } }'
    )


def test_shape_unity():
    u = Shape.unity()
    assert str(u) == "{}"
    assert list(u.labels) == []
    assert len(u) == 1


def test_shape_labels_ndslice_extent(shape):
    assert list(shape.labels) == ["x", "y"]
    assert shape.ndslice == Slice.new_row_major([2, 3])
    assert shape.extent == Extent(["x", "y"], [2, 3])
    assert len(shape) == 6
    assert list(shape.ranks()) == [0, 1, 2, 3, 4, 5]


def test_shape_coordinates(shape):
    assert dict(shape.coordinates(4)) == {"x": 1, "y": 1}


def test_shape_at_removes_the_dimension(shape):
    sub = shape.at("x", 1)
    assert str(sub) == "{y=3}"
    assert sub.ndslice == Slice(offset=3, sizes=[3], strides=[1])


def test_shape_index_many(shape):
    assert shape.index(x=1) == shape.at("x", 1)
    assert list(shape.index(x=1, y=2).ndslice) == [5]


def test_shape_select_keeps_the_dimension(shape):
    sub = shape.select("y", slice(1, 3))
    assert str(sub) == "{x=2,y=2}"
    assert list(sub.ndslice) == [1, 2, 4, 5]


def test_shape_at_unknown_label(shape):
    with pytest.raises(ValueError, match="invalid label"):
        shape.at("z", 0)


def test_shape_at_out_of_range(shape):
    with pytest.raises(ValueError, match="out of range"):
        shape.at("x", 5)


def test_shape_label_slice_mismatch():
    with pytest.raises(ValueError, match="label slice dimension mismatch"):
        Shape(["x"], Slice.new_row_major([2, 3]))


def test_shape_equality_and_pickle(shape):
    assert shape == Shape(["x", "y"], Slice.new_row_major([2, 3]))
    assert shape != Shape(["x", "z"], Slice.new_row_major([2, 3]))
    assert pickle.loads(pickle.dumps(shape)) == shape
