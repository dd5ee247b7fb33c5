"""``ranks(...)`` of the debugger's ``cast``: which ranks each spelling chooses."""

from __future__ import annotations

import pytest

from regency.observe.debug_ranks import RankSpecError, parse_ranks

pytestmark = pytest.mark.timeout(10)

GRID = [(r, {"hosts": r // 4, "gpus": r % 4}) for r in range(8)]


def chosen(text: str) -> list[int]:
    spec = parse_ranks(text)
    return [rank for rank, coords in GRID if spec.matches(rank, coords)]


@pytest.mark.parametrize(
    ("text", "ranks"),
    [
        ("ranks(3)", [3]),
        ("ranks(0,1,5)", [0, 1, 5]),
        ("ranks( 2 , 6 )", [2, 6]),
        ("ranks(2:7:2)", [2, 4, 6]),
        ("ranks(:)", list(range(8))),
        ("ranks(5:)", [5, 6, 7]),
        ("ranks(:3)", [0, 1, 2]),
        ("ranks(::3)", [0, 3, 6]),
        ("ranks(hosts=1)", [4, 5, 6, 7]),
        ("ranks(hosts=1, gpus=0:2)", [4, 5]),
        ("ranks(gpus=[0,3])", [0, 3, 4, 7]),
        ("ranks(hosts=[0], gpus=[1,2])", [1, 2]),
        ("ranks(racks=0)", []),  # a dimension the ranks don't have chooses none
        ("ranks(9)", []),
    ],
)
def test_each_spelling_chooses_its_ranks(text: str, ranks: list[int]) -> None:
    assert chosen(text) == ranks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rank(1)", "is not ranks(...)"),
        ("ranks(1", "is not ranks(...)"),
        ("ranks()", "is empty"),
        ("ranks(a)", "'a' in ranks(a) is not a number"),
        ("ranks(1:2:3:4)", "a range is start:stop:step"),
        ("ranks(::0)", "the step must be positive"),
        ("ranks(::-1)", "the step must be positive"),
        ("ranks(hosts=1, hosts=2)", "dimension 'hosts' is given twice"),
        ("ranks(hosts=1, 2)", "'2' in ranks(hosts=1, 2) is not DIM=RANKS"),
        ("ranks(9x=1)", "is not DIM=RANKS"),
        ("ranks(gpus=)", "gpus= of ranks(gpus=) is empty"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(RankSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_ranks(text)
