"""Slice: row-major mapping of coordinates to base ranks, its inverse, and its errors."""

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regency.shape import Slice

pytestmark = pytest.mark.timeout(30)


def test_row_major_mapping_of_2x3() -> None:
    s = Slice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert list(s) == [0, 1, 2, 3, 4, 5]
    assert [s[i] for i in range(len(s))] == [0, 1, 2, 3, 4, 5]
    assert s.coordinates(4) == [1, 1]
    assert s.nditem([1, 2]) == 5
    assert s.index(5) == 5
    assert (s.offset, s.sizes, s.strides, s.ndim, len(s)) == (0, [2, 3], [3, 1], 2, 6)


def test_view_of_4x3_with_offset_and_gap() -> None:
    # Columns 1..2 of rows 0..1 of a 4x3 row-major mesh.
    s = Slice(1, [2, 2], [3, 1])
    assert list(s) == [1, 2, 4, 5]
    assert [s.index(r) for r in (1, 2, 4, 5)] == [0, 1, 2, 3]
    assert s.coordinates(4) == [1, 0]
    # Every other row of the same mesh.
    t = Slice(1, [2, 2], [6, 1])
    assert list(t) == [1, 2, 7, 8]
    assert t[2] == 7


def test_row_major_order_ignores_stride_order() -> None:
    # A transposed view: the last dimension still varies fastest.
    s = Slice(0, [2, 3], [1, 2])
    assert list(s) == [0, 2, 4, 1, 3, 5]
    assert s.index(1) == 3
    assert s.coordinates(3) == [1, 1]


def test_str_and_repr_match_monarch() -> None:
    s = Slice(0, [2, 3], [3, 1])
    assert str(s) == "Slice { offset: 0, sizes: [2, 3], strides: [3, 1] }"
    assert repr(s) == str(s)
    assert str(Slice(0, [], [])) == "Slice { offset: 0, sizes: [], strides: [] }"


def test_new_row_major() -> None:
    assert Slice.new_row_major([2, 3, 4]) == Slice(0, [2, 3, 4], [12, 4, 1])
    assert Slice.new_row_major([]) == Slice(0, [], [])
    assert list(Slice.new_row_major([5])) == [0, 1, 2, 3, 4]


def test_zero_dim_slice_has_one_element() -> None:
    s = Slice(7, [], [])
    assert len(s) == 1
    assert list(s) == [7]
    assert s[0] == 7
    assert s.index(7) == 0
    assert s.coordinates(7) == []
    assert s.nditem([]) == 7


def test_empty_slice() -> None:
    s = Slice(0, [3, 0], [1, 1])
    assert len(s) == 0
    assert list(s) == []
    with pytest.raises(IndexError):
        s[0]
    with pytest.raises(ValueError, match="not in slice"):
        s.index(0)


def test_getitem_errors() -> None:
    s = Slice.new_row_major([2, 2])
    with pytest.raises(TypeError, match="non-negative"):
        s[-1]
    with pytest.raises(IndexError, match="out of range"):
        s[4]
    with pytest.raises(TypeError):
        s["0"]  # type: ignore[call-overload]


def test_getitem_with_python_slice_returns_tuple() -> None:
    s = Slice(10, [4], [2])
    assert s[1:3] == (12, 14)
    assert s[::2] == (10, 14)


def test_index_and_coordinates_reject_absent_ranks() -> None:
    s = Slice(1, [2, 2], [3, 1])
    for absent in (0, 3, 6, 100):
        with pytest.raises(ValueError, match=f"value {absent} not in slice"):
            s.index(absent)
        with pytest.raises(ValueError):
            s.coordinates(absent)
        assert absent not in s
    assert 4 in s
    one_d = Slice(3, [3], [2])
    for absent in (1, 4, 9, 2):
        with pytest.raises(ValueError):
            one_d.index(absent)


def test_nditem_errors() -> None:
    s = Slice.new_row_major([2, 3])
    with pytest.raises(IndexError, match="out of range"):
        s.nditem([2, 0])
    with pytest.raises(IndexError):
        s.nditem([0, -1])
    with pytest.raises(ValueError, match="expected 2"):
        s.nditem([0])


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="same length"):
        Slice(0, [2, 3], [1])
    with pytest.raises(ValueError, match=">= 0"):
        Slice(-1, [2], [1])
    with pytest.raises(ValueError, match=">= 0"):
        Slice(0, [-2], [1])
    with pytest.raises(ValueError, match="overlapping"):
        Slice(0, [2, 3], [1, 1])
    with pytest.raises(ValueError, match="overlapping"):
        Slice(0, [3, 3], [2, 1])
    with pytest.raises(ValueError, match="overlapping"):
        Slice(0, [2], [0])
    # Size-1 dimensions never move, so their strides are free.
    assert list(Slice(0, [1, 3], [0, 1])) == [0, 1, 2]


def test_from_list() -> None:
    assert Slice.from_list([1, 2, 4, 5]) == Slice(1, [2, 2], [3, 1])
    assert Slice.from_list([0, 1, 2, 3]) == Slice(0, [4], [1])
    assert Slice.from_list([3, 5, 7]) == Slice(3, [3], [2])
    assert Slice.from_list([9]) == Slice(9, [1], [1])
    assert Slice.from_list([0, 2, 1, 3]) == Slice(0, [2, 2], [1, 2])
    assert list(Slice.from_list([1, 2, 7, 8, 13, 14])) == [1, 2, 7, 8, 13, 14]


@pytest.mark.parametrize(
    "ranks",
    [[], [1, 1], [3, 2], [0, 1, 3], [0, 1, 2, 4, 5], [0, 1, 5, 7], [0, 2, 1, 2]],
)
def test_from_list_rejects_irregular_ranks(ranks: list[int]) -> None:
    with pytest.raises(ValueError):
        Slice.from_list(ranks)


def test_immutable_hashable_picklable() -> None:
    s = Slice(1, [2, 2], [3, 1])
    assert s == Slice(1, [2, 2], [3, 1])
    assert s != Slice(1, [2, 2], [6, 1])
    assert s != "Slice"
    assert len({s, Slice(1, [2, 2], [3, 1])}) == 1
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.offset = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        s._offset = 3
    # Returned lists are copies.
    s.sizes.append(9)
    assert s.sizes == [2, 2]


def test_large_contiguous_slice_is_cheap() -> None:
    s = Slice(5, [10**12], [1])
    assert len(s) == 10**12
    assert s[10**12 - 1] == 5 + 10**12 - 1
    assert s.index(5 + 123456789) == 123456789
    it = iter(s)
    assert [next(it) for _ in range(3)] == [5, 6, 7]


def _brute_force(s: Slice) -> list[int]:
    ranks = [s.offset]
    for n, stride in zip(s.sizes, s.strides, strict=True):
        ranks = [r + c * stride for r in ranks for c in range(n)]
    return ranks


@st.composite
def slices(draw: st.DrawFn) -> Slice:
    """Random non-overlapping slices: row-major layouts, viewed with random steps."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=0, max_size=4))
    base = Slice.new_row_major(sizes)
    offset = draw(st.integers(0, 50))
    new_sizes: list[int] = []
    new_strides: list[int] = []
    for n, stride in zip(base.sizes, base.strides, strict=True):
        start = draw(st.integers(0, n - 1))
        step = draw(st.integers(1, 3))
        count = len(range(start, n, step))
        offset += start * stride
        new_sizes.append(count)
        new_strides.append(stride * step)
    order = draw(st.permutations(range(len(new_sizes))))
    return Slice(offset, [new_sizes[i] for i in order], [new_strides[i] for i in order])


@given(slices())
def test_property_iteration_matches_brute_force(s: Slice) -> None:
    expected = _brute_force(s)
    assert list(s) == expected
    assert [s[i] for i in range(len(s))] == expected


@given(slices())
def test_property_index_inverts_getitem(s: Slice) -> None:
    for i, rank in enumerate(s):
        assert s.index(rank) == i
        assert s.nditem(s.coordinates(rank)) == rank


@given(slices(), st.integers(0, 200))
def test_property_membership_is_exact(s: Slice, rank: int) -> None:
    assert (rank in s) == (rank in set(s))


@given(slices())
def test_property_from_list_round_trips(s: Slice) -> None:
    ranks = list(s)
    if not ranks:
        return
    assert list(Slice.from_list(ranks)) == ranks
