"""Extent and Point: labelled sizes, positions in them, and their Monarch str forms."""

import pickle
from collections.abc import Mapping

import pytest

from regency.shape import DimensionNotFoundError, Extent, Point, Shape, Slice

pytestmark = pytest.mark.timeout(30)


def test_extent_is_an_ordered_mapping() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert isinstance(e, Mapping)
    assert e["hosts"] == 2
    assert e["gpus"] == 4
    assert list(e) == ["hosts", "gpus"]
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert len(e) == 2
    assert "gpus" in e
    assert "cpus" not in e
    assert e.get("cpus") is None
    assert (e.labels, e.sizes, e.nelements) == (["hosts", "gpus"], [2, 4], 8)


def test_extent_str_and_repr() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert str(e) == "{hosts: 2, gpus: 4}"
    assert repr(e) == "{hosts: 2, gpus: 4}"
    assert str(Extent([], [])) == "{}"


def test_extent_nelements_edge_cases() -> None:
    assert Extent([], []).nelements == 1
    assert Extent(["a", "b"], [3, 0]).nelements == 0


def test_extent_unknown_label_is_keyerror_and_valueerror() -> None:
    e = Extent(["hosts"], [2])
    with pytest.raises(DimensionNotFoundError, match="Dimension 'gpus' not found") as info:
        e["gpus"]
    assert isinstance(info.value, KeyError)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("Dimension 'gpus' not found")


@pytest.mark.parametrize(
    ("labels", "sizes", "error", "match"),
    [
        (["a", "a"], [1, 2], ValueError, "unique"),
        (["a", "b"], [1], ValueError, "one size per label"),
        (["a"], [1, 2], ValueError, "one size per label"),
        (["a"], [-1], ValueError, ">= 0"),
        (["a", 3], [1, 2], TypeError, "str"),
        ("ab", [1, 2], TypeError, "not a str"),
        (["a"], [True], TypeError, "bool"),
    ],
)
def test_extent_validation(labels: list[str], sizes: list[int], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Extent(labels, sizes)


def test_extent_equality_hash_pickle_immutability() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert e == Extent(["hosts", "gpus"], [2, 4])
    assert e != Extent(["gpus", "hosts"], [4, 2])  # order matters
    assert e != {"hosts": 2, "gpus": 4}
    assert hash(e) == hash(Extent(["hosts", "gpus"], [2, 4]))
    assert pickle.loads(pickle.dumps(e)) == e
    with pytest.raises(AttributeError):
        e.x = 1


def test_point_coordinates_are_row_major() -> None:
    e = Extent(["hosts", "gpus"], [2, 3])
    coords = [dict(Point(r, e)) for r in range(6)]
    assert coords == [
        {"hosts": 0, "gpus": 0},
        {"hosts": 0, "gpus": 1},
        {"hosts": 0, "gpus": 2},
        {"hosts": 1, "gpus": 0},
        {"hosts": 1, "gpus": 1},
        {"hosts": 1, "gpus": 2},
    ]
    p = Point(4, e)
    assert p.rank == 4
    assert p.extent == e
    assert p["gpus"] == 1
    assert p.size("gpus") == 3
    assert list(p) == ["hosts", "gpus"]
    assert len(p) == 2


def test_point_str_matches_monarch() -> None:
    p = Point(1, Extent(["hosts", "gpus"], [1, 2]))
    assert str(p) == "{'hosts': 0/1, 'gpus': 1/2}"
    assert repr(p) == str(p)
    assert str(Point(0, Extent([], []))) == "{}"


def test_point_errors() -> None:
    e = Extent(["hosts"], [2])
    with pytest.raises(IndexError, match="out of range"):
        Point(2, e)
    with pytest.raises(IndexError):
        Point(-1, e)
    with pytest.raises(IndexError):
        Point(0, Extent(["a"], [0]))
    with pytest.raises(TypeError, match="Extent"):
        Point(0, {"hosts": 2})  # type: ignore[arg-type]
    p = Point(1, e)
    with pytest.raises(DimensionNotFoundError):
        p["gpus"]
    with pytest.raises(KeyError):
        p.size("gpus")
    assert p.get("gpus") is None


def test_point_equality_hash_pickle() -> None:
    e = Extent(["hosts", "gpus"], [2, 3])
    p = Point(4, e)
    assert p == Point(4, Extent(["hosts", "gpus"], [2, 3]))
    assert p != Point(3, e)
    assert p != Point(4, Extent(["h", "g"], [2, 3]))
    assert p != {"hosts": 1, "gpus": 1}
    assert len({p, Point(4, e)}) == 1
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        p.rank = 0  # type: ignore[misc]


def test_point_splats_into_slice() -> None:
    shape = Shape(["hosts", "gpus"], Slice.new_row_major([2, 3]))
    point = Point(4, shape.extent)
    single = shape.slice(**point)
    assert single.ranks() == [4]
    assert single.ndim == 0
    partial = shape.slice(**{"gpus": point["gpus"]})
    assert partial.ranks() == [1, 4]
