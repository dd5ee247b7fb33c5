"""Selection: parsing Monarch's selection algebra, evaluating it, printing it back."""

import pickle
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from regency.shape import Selection, Shape, Slice

pytestmark = pytest.mark.timeout(30)

GRID = Shape(["hosts", "gpus"], Slice.new_row_major([4, 3]))  # ranks 0..11


def ev(expr: str, target: Shape | Slice = GRID) -> list[int]:
    return Selection.from_string(expr).eval(target)


@pytest.mark.parametrize(
    ("expr", "ranks"),
    [
        ("*", list(range(12))),
        ("*, *", list(range(12))),
        ("0", [0, 1, 2]),
        ("1, 2", [5]),
        ("*, 1", [1, 4, 7, 10]),
        ("*, 1:3", [1, 2, 4, 5, 7, 8, 10, 11]),
        ("(*, 1:3) & (0, *)", [1, 2]),
        ("0, * | 3, 2", [0, 1, 2, 11]),
        ("1:3, 0", [3, 6]),
        ("0:4:2, 1", [1, 7]),
        ("::2, :1", [0, 6]),
        ("2:", [6, 7, 8, 9, 10, 11]),
        (":", list(range(12))),
        ("1::2, 0", [3, 9]),
        ("*, (0 | 2)", [0, 2, 3, 5, 6, 8, 9, 11]),
        ("(1 | 3), 1", [4, 10]),
        ("0 & 1", []),
        ("*, 0:2 & *, 1:3", [1, 4, 7, 10]),
        ("5:9, *", []),
        ("2:100, 2", [8, 11]),
        ("?", [0, 1, 2]),
        ("?, ?", [0]),
        ("3, ?", [9]),
    ],
)
def test_eval(expr: str, ranks: list[int]) -> None:
    assert ev(expr) == ranks


def test_eval_on_a_view_returns_base_ranks() -> None:
    view = GRID.slice(hosts=slice(1, 4, 2), gpus=slice(1, 3))  # ranks 4, 5, 10, 11
    assert ev("*", view) == [4, 5, 10, 11]
    assert ev("1, 0", view) == [10]
    assert ev("*, 1", view.ndslice) == [5, 11]
    assert ev("1:", GRID.slice(hosts=2)) == [7, 8]  # dense, with an offset


def test_eval_returns_row_major_order_for_transposed_slices() -> None:
    transposed = Slice(0, [2, 3], [1, 2])
    assert list(transposed) == [0, 2, 4, 1, 3, 5]
    assert ev("*", transposed) == [0, 2, 4, 1, 3, 5]
    assert ev("1 | 0, 2", transposed) == [4, 1, 3, 5]


def test_eval_zero_dim_and_empty_targets() -> None:
    assert Selection.all().eval(Shape.unity()) == [0]
    with pytest.raises(ValueError, match="exceeds dimensionality 0"):
        ev("0", Shape.unity())
    empty = Slice(0, [0], [1])
    assert ev("*", empty) == []
    assert ev("?", empty) == []


def test_selection_deeper_than_the_shape_is_an_error() -> None:
    with pytest.raises(ValueError, match="exceeds dimensionality 2"):
        ev("*, *, 0")
    with pytest.raises(ValueError, match="exceeds dimensionality 2"):
        ev("*, *, ?")
    # Trailing `*` past the last dimension selects nothing less (all(true) == true).
    assert ev("*, *, *") == list(range(12))
    assert ev("1, 1, *") == [4]
    with pytest.raises(ValueError, match="exceeds dimensionality 2"):
        ev("* | 0, 0, 0")


def test_any_with_a_random_generator() -> None:
    rng = random.Random(7)
    seen = {tuple(Selection.any(2).eval(GRID, rng)) for _ in range(200)}
    assert all(len(ranks) == 1 for ranks in seen)
    assert len(seen) == 12  # every element gets picked eventually
    # Deterministic without a generator: the first index.
    assert Selection.any(2).eval(GRID) == [0]
    assert Selection.any().eval(GRID) == [0, 1, 2]


def test_constructors() -> None:
    assert Selection.all() == Selection.from_string("*")
    assert Selection.any() == Selection.from_string("?")
    assert Selection.any(3) == Selection.from_string("?, ?, ?")
    assert Selection("0, 1") == Selection.from_string("0,1")
    with pytest.raises(ValueError):
        Selection.any(0)
    with pytest.raises(TypeError):
        Selection(3)  # type: ignore[arg-type]


def test_operators() -> None:
    a = Selection.from_string("*, 1:3")
    b = Selection.from_string("0, *")
    assert (a & b) == Selection.from_string("(*, 1:3) & (0, *)")
    assert (a & b).eval(GRID) == [1, 2]
    assert (a | b).eval(GRID) == [0, 1, 2, 4, 5, 7, 8, 10, 11]


@pytest.mark.parametrize(
    ("expr", "canonical"),
    [
        ("*", "*"),
        ("(*, 1:3) & (0, *)", "(*, 1:3) & (0, *)"),
        ("*,1:3&0,*", "(*, 1:3) & (0, *)"),
        ("4:5", "4"),
        ("4:8", "4:8"),
        ("4:", "4:"),
        (":", "0:"),
        ("1::2", "1::2"),
        ("1:7:2", "1:7:2"),
        ("?", "?"),
        ("0, ?, :4", "0, ?, 0:4"),
        ("*, *, (1:4 | 5:6)", "*, *, (1:4 | 5)"),
        ("(1|3),*", "(1, *) | (3, *)"),
        ("((1:4), 2)", "1:4, 2"),
        ("0|1", "0 | 1"),
        ("0 | (1 | 2)", "0 | (1 | 2)"),
        ("(0 | 1) | 2", "0 | 1 | 2"),
        ("0 & (1 | 2)", "0 & (1 | 2)"),
        ("0 & 1 | 2", "0 & 1 | 2"),
        ("0 & (1 & 2)", "0 & (1 & 2)"),
    ],
)
def test_canonical_str_round_trips(expr: str, canonical: str) -> None:
    sel = Selection.from_string(expr)
    assert str(sel) == canonical
    assert Selection.from_string(str(sel)) == sel
    assert repr(sel) == f"Selection.from_string({canonical!r})"


@pytest.mark.parametrize(
    ("expr", "position"),
    [
        ("", "end of input"),
        ("   ", "position 0"),
        ("(*, 1", "end of input"),
        ("*,", "end of input"),
        ("* *", "position 2"),
        ("1:2:0", "position 4"),
        ("1::", "end of input"),
        ("-1", "position 0"),
        ("*, x", "position 3"),
        ("(*))", "position 3"),
        ("0 | & 1", "position 4"),
        ("1 2", "position 2"),
    ],
)
def test_parse_errors_name_the_position(expr: str, position: str) -> None:
    with pytest.raises(ValueError, match=position):
        Selection.from_string(expr)


def test_parse_rejects_absurd_nesting() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        Selection.from_string("(" * 500 + "*" + ")" * 500)
    with pytest.raises(ValueError, match="nested too deeply"):
        Selection.from_string(", ".join(["0"] * 1000))


def test_value_semantics() -> None:
    sel = Selection.from_string("(*, 1:3) & (0, *)")
    assert pickle.loads(pickle.dumps(sel)) == sel
    assert hash(sel) == hash(Selection.from_string("*,1:3 & 0,*"))
    assert sel != Selection.from_string("*")
    assert sel != "*"
    with pytest.raises(AttributeError):
        sel._node = None  # type: ignore[assignment]


# -- properties ----------------------------------------------------------------------------

_leaf = st.sampled_from(["*", "?", "0", "1", "2", "1:3", "0::2", ":2", "2:"])
_chains = st.lists(_leaf, min_size=1, max_size=2).map(", ".join)
_exprs = st.recursive(
    _chains,
    lambda inner: st.tuples(inner, st.sampled_from([" | ", " & "]), inner).map(
        lambda t: f"({t[0]}){t[1]}({t[2]})"
    ),
    max_leaves=6,
)


@given(_exprs)
def test_property_str_round_trips(expr: str) -> None:
    sel = Selection.from_string(expr)
    again = Selection.from_string(str(sel))
    assert again == sel
    assert str(again) == str(sel)


@given(_exprs)
def test_property_eval_is_sorted_unique_and_within_the_shape(expr: str) -> None:
    ranks = Selection.from_string(expr).eval(GRID)
    assert ranks == sorted(set(ranks))
    assert set(ranks) <= set(GRID.ranks())


@given(_exprs, _exprs)
def test_property_operators_are_set_operations(a: str, b: str) -> None:
    sa, sb = Selection.from_string(a), Selection.from_string(b)
    ra, rb = set(sa.eval(GRID)), set(sb.eval(GRID))
    assert (sa | sb).eval(GRID) == sorted(ra | rb)
    assert (sa & sb).eval(GRID) == sorted(ra & rb)


@given(st.integers(0, 3), st.integers(0, 3), st.integers(1, 3), st.integers(0, 2))
def test_property_ranges_match_python_ranges(start: int, stop: int, step: int, col: int) -> None:
    ranks = ev(f"{start}:{stop}:{step}, {col}")
    assert ranks == [GRID.ndslice.nditem([r, col]) for r in range(start, min(stop, 4), step)]


SPREAD = Shape(["hosts", "gpus"], Slice(5, [4, 3], [1, 10]))  # same sizes as GRID, sparse


@given(_exprs)
def test_property_eval_on_a_view_maps_positions_through_its_slice(expr: str) -> None:
    sel = Selection.from_string(expr)
    positions = sel.eval(GRID)  # GRID is dense from 0, so its ranks are positions
    assert sel.eval(SPREAD) == [SPREAD.ndslice[p] for p in positions]
