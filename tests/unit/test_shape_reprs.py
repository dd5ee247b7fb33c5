"""The text forms of the shape types, as Monarch 0.7.0 prints them (observed side by side)."""

from __future__ import annotations

import pytest

from regency.shape import Extent, Point, Shape, Slice


def test_extent_prints_bare_labels_like_monarch() -> None:
    e = Extent(["a", "b"], [3, 4])
    assert str(e) == repr(e) == "{a: 3, b: 4}"
    assert str(Extent([], [])) == "{}"
    assert str(Point(5, e).extent) == "{a: 3, b: 4}"
    assert str(Shape.from_extent(e).extent) == "{a: 3, b: 4}"


@pytest.mark.parametrize(
    ("label", "text"),
    [
        ("hosts", "{hosts: 2}"),
        ("A9_", "{A9_: 2}"),
        ("1a", "{1a: 2}"),
        ("", "{: 2}"),
        ("a-b", '{"a-b": 2}'),
        ("a b", '{"a b": 2}'),
        ("é", '{"é": 2}'),
        ("c'd", '{"c\'d": 2}'),
        ('a"b', '{"a\\"b": 2}'),
        ("\n\t\\\x01\u200b", '{"\\n\\t\\\\\\u{1}\\u{200b}": 2}'),
    ],
)
def test_extent_quotes_labels_that_are_not_identifier_like(label: str, text: str) -> None:
    assert str(Extent([label], [2])) == text


def test_point_quotes_labels_in_single_quotes_without_escaping() -> None:
    e = Extent(["a b", "c'd"], [1, 2])
    assert str(Point(1, e)) == "{'a b': 0/1, 'c'd': 1/2}"
    assert str(Point(5, Extent(["a", "b"], [3, 4]))) == "{'a': 1/3, 'b': 1/4}"


def test_shape_repr_escapes_labels_and_str_does_not() -> None:
    s = Shape(["a b", "c'd", 'x"y'], Slice.new_row_major([1, 2, 1]))
    assert repr(s) == (
        'Shape { labels: ["a b", "c\'d", "x\\"y"], '
        "slice: Slice { offset: 0, sizes: [1, 2, 1], strides: [2, 1, 1] } }"
    )
    assert str(s) == "{a b=1,c'd=2,x\"y=1}"


def test_zero_dimensional_forms() -> None:
    assert (
        repr(Shape.unity())
        == "Shape { labels: [], slice: Slice { offset: 0, sizes: [], strides: [] } }"
    )
    assert str(Shape.unity()) == "{}"
    assert str(Point(0, Extent([], []))) == "{}"
    assert (
        str(Slice(offset=0, sizes=[], strides=[])) == "Slice { offset: 0, sizes: [], strides: [] }"
    )
