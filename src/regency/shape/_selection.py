"""`Selection`: Monarch's ndslice selection algebra, parsed from strings and evaluated.

Grammar (whitespace between tokens is ignored)::

    expression   ::= intersection ( "|" intersection )*
    intersection ::= chain ( "&" chain )*
    chain        ::= group ( "," group )*
    group        ::= "*" | "?" | index | range | "(" expression ")"
    index        ::= number
    range        ::= number? ":" number? ( ":" number )?
    number       ::= [0-9]+

``,`` descends into the next dimension, ``&`` binds tighter than ``|``. A parenthesised
group followed by ``,`` distributes the rest of the chain into every branch, exactly as in
Monarch: ``(1 | 3), *`` is ``(1, * | 3, *)``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from ._ops import is_dense
from ._shape import Shape
from ._slice import Slice

# -- syntax tree ----------------------------------------------------------------------


@dataclass(frozen=True)
class _True:
    """Everything from this dimension on (the end of a chain)."""


@dataclass(frozen=True)
class _All:
    """``*``: every index of this dimension, then ``inner``."""

    inner: _Node


@dataclass(frozen=True)
class _Any:
    """``?``: one index of this dimension (random, or the first), then ``inner``."""

    inner: _Node


@dataclass(frozen=True)
class _Range:
    """``start:stop:step`` (``stop`` None = to the end) of this dimension, then ``inner``."""

    start: int
    stop: int | None
    step: int
    inner: _Node


@dataclass(frozen=True)
class _Union:
    """``left | right``."""

    left: _Node
    right: _Node


@dataclass(frozen=True)
class _Intersection:
    """``left & right``."""

    left: _Node
    right: _Node


_Node = _True | _All | _Any | _Range | _Union | _Intersection
_TRUE = _True()
_MAX_DEPTH = 256  # nodes from root to leaf; keeps every recursion far from the limit
_MAX_PARENS = 64
_MAX_LENGTH = 100_000


def _nest(dim: _Node, tail: _Node) -> _Node:
    """Put ``tail`` at the end of every chain in ``dim`` (the meaning of ``,``)."""
    if isinstance(dim, _True):
        return tail
    if isinstance(dim, _All):
        return _All(_nest(dim.inner, tail))
    if isinstance(dim, _Any):
        return _Any(_nest(dim.inner, tail))
    if isinstance(dim, _Range):
        return _Range(dim.start, dim.stop, dim.step, _nest(dim.inner, tail))
    if isinstance(dim, _Union):
        return _Union(_nest(dim.left, tail), _nest(dim.right, tail))
    return _Intersection(_nest(dim.left, tail), _nest(dim.right, tail))


def _children(node: _Node) -> tuple[_Node, ...]:
    if isinstance(node, (_All, _Any, _Range)):
        return (node.inner,)
    if isinstance(node, (_Union, _Intersection)):
        return (node.left, node.right)
    return ()


def _depth(node: _Node) -> int:
    """Return the depth of the tree, computed without recursion."""
    deepest = 0
    stack = [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in _children(current))
    return deepest


# -- parser ---------------------------------------------------------------------------


class _Parser:
    """Recursive-descent parser over the text, tracking positions for error messages."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.nesting = 0

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        at = self.pos if pos is None else pos
        where = f"at position {at}" if at < len(self.text) else "at end of input"
        raise ValueError(f"invalid selection {self.text!r}: {message} {where}")

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip_space()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self, char: str) -> bool:
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def number(self) -> int | None:
        self.skip_space()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        return int(self.text[start : self.pos]) if self.pos > start else None

    def parse(self) -> _Node:
        if not self.text.strip():
            self.fail("empty expression", 0)
        node = self.expression()
        if self.peek():
            self.fail(f"unexpected {self.peek()!r}")
        return node

    def expression(self) -> _Node:
        node = self.intersection()
        while self.take("|"):
            node = _Union(node, self.intersection())
        return node

    def intersection(self) -> _Node:
        node = self.chain()
        while self.take("&"):
            node = _Intersection(node, self.chain())
        return node

    def chain(self) -> _Node:
        groups = [self.group()]
        while self.take(","):
            groups.append(self.group())
        node: _Node = _TRUE
        for group in reversed(groups):
            node = _nest(group, node)
        return node

    def group(self) -> _Node:
        char = self.peek()
        if char == "*":
            self.pos += 1
            return _All(_TRUE)
        if char == "?":
            self.pos += 1
            return _Any(_TRUE)
        if char == "(":
            open_at = self.pos
            self.pos += 1
            self.nesting += 1
            if self.nesting > _MAX_PARENS:
                self.fail("parentheses nested too deeply", open_at)
            node = self.expression()
            if not self.take(")"):
                self.fail(f"expected ')' to close the '(' at position {open_at}")
            self.nesting -= 1
            return node
        if char.isdigit() or char == ":":
            return self.range_or_index()
        found = f"unexpected {char!r}" if char else "unexpected end of input"
        self.fail(f"{found}; expected '*', '?', an index, a range or '('")

    def range_or_index(self) -> _Node:
        start = self.number()
        if not self.take(":"):
            assert start is not None  # group() only calls us on a digit or ':'
            return _Range(start, start + 1, 1, _TRUE)
        stop = self.number()
        step = 1
        if self.take(":"):
            self.skip_space()
            step_at = self.pos
            given = self.number()
            if given is None:
                self.fail("expected a step after the second ':'")
            if given == 0:
                self.fail("range step must be > 0", step_at)
            step = given
        return _Range(0 if start is None else start, stop, step, _TRUE)


# -- printer --------------------------------------------------------------------------


def _range_text(node: _Range) -> str:
    if node.step == 1:
        if node.stop is None:
            return f"{node.start}:"
        if node.stop == node.start + 1:
            return f"{node.start}"
        return f"{node.start}:{node.stop}"
    stop = "" if node.stop is None else str(node.stop)
    return f"{node.start}:{stop}:{node.step}"


def _format(node: _Node) -> str:
    if isinstance(node, _Union):
        return f"{_operand(node.left, '|', False)} | {_operand(node.right, '|', True)}"
    if isinstance(node, _Intersection):
        return f"{_operand(node.left, '&', False)} & {_operand(node.right, '&', True)}"
    parts: list[str] = []
    current: _Node = node
    while True:
        if isinstance(current, _All):
            parts.append("*")
        elif isinstance(current, _Any):
            parts.append("?")
        elif isinstance(current, _Range):
            parts.append(_range_text(current))
        elif isinstance(current, _True):
            break
        else:
            parts.append(f"({_format(current)})")
            break
        current = current.inner
    return ", ".join(parts)


def _operand(node: _Node, op: str, right: bool) -> str:
    text = _format(node)
    if isinstance(node, _Union):
        wrap = op == "&" or right
    elif isinstance(node, _Intersection):
        wrap = op == "&" and right
    else:
        wrap = ", " in text  # redundant, but reads better: (*, 1:3) & (0, *)
    return f"({text})" if wrap else text


# -- evaluation -----------------------------------------------------------------------


def _is_everything(node: _Node) -> bool:
    """Whether ``node`` is ``*, *, ...`` (Monarch's identity ``all(true) == true``)."""
    while isinstance(node, _All):
        node = node.inner
    return isinstance(node, _True)


def _check_depth(node: _Node, ndim: int, dim: int, top: Selection) -> None:
    if dim == ndim and not _is_everything(node):
        raise ValueError(f"selection `{top}` exceeds dimensionality {ndim}")
    if isinstance(node, (_Union, _Intersection)):
        _check_depth(node.left, ndim, dim, top)
        _check_depth(node.right, ndim, dim, top)
    elif isinstance(node, (_All, _Any, _Range)):
        _check_depth(node.inner, ndim, dim + 1, top)


class _Evaluator:
    """Evaluates a tree to sorted row-major positions over ``sizes``."""

    def __init__(self, sizes: list[int], rng: random.Random | None) -> None:
        self.sizes = sizes
        self.rng = rng
        # blocks[d]: number of positions under one index prefix of length d.
        self.blocks = [1] * (len(sizes) + 1)
        for d in range(len(sizes) - 1, -1, -1):
            self.blocks[d] = self.blocks[d + 1] * sizes[d]

    def positions(self, node: _Node, dim: int, prefix: int) -> Iterable[int]:
        if dim == len(self.sizes):
            return (prefix,)  # past the last dimension: only `*`s and the end remain
        if isinstance(node, _True):
            block = self.blocks[dim]
            return range(prefix * block, (prefix + 1) * block)
        if isinstance(node, _Union):
            left = set(self.positions(node.left, dim, prefix))
            return sorted(left.union(self.positions(node.right, dim, prefix)))
        if isinstance(node, _Intersection):
            left = set(self.positions(node.left, dim, prefix))
            return sorted(left.intersection(self.positions(node.right, dim, prefix)))
        size = self.sizes[dim]
        indices: Iterable[int]
        if isinstance(node, _All):
            indices = range(size)
        elif isinstance(node, _Range):
            stop = size if node.stop is None else min(node.stop, size)
            indices = range(node.start, stop, node.step)
        elif size == 0:
            indices = ()
        else:
            indices = (self.rng.randrange(size) if self.rng is not None else 0,)
        inner = node.inner
        base = prefix * size
        if isinstance(inner, _True) and isinstance(indices, range):
            block = self.blocks[dim + 1]
            if block == 1:
                return range(base + indices.start, base + indices.stop, indices.step)
        result: list[int] = []
        for i in indices:
            result.extend(self.positions(inner, dim + 1, base + i))
        return result


# -- public class ---------------------------------------------------------------------


class Selection:
    """A selection over the coordinates of an N-dimensional shape (Monarch's algebra).

    Parse one from a string, then evaluate it against a `Shape` or `Slice`::

        >>> shape = Shape(["hosts", "gpus"], Slice.new_row_major([4, 3]))
        >>> sel = Selection.from_string("(*, 1:3) & (0, *)")
        >>> sel.eval(shape)
        [1, 2]
        >>> str(sel)
        '(*, 1:3) & (0, *)'

    Syntax: ``*`` all indices of a dimension, ``n`` one index, ``a:b`` / ``a:b:s`` /
    ``a:`` / ``:`` ranges (the end is clipped to the dimension), ``?`` one index chosen
    at random, ``,`` moves to the next dimension, ``&`` intersection, ``|`` union,
    parentheses group. A selection shorter than the shape selects everything in the
    remaining dimensions (``"0"`` on a 4x3 shape is the whole first row); one longer than
    the shape is an error at evaluation, except for trailing ``*`` (so `Selection.all`
    selects the one element of a 0-dimensional shape).

    ``str`` gives a canonical form that parses back to an equal selection. Selections are
    immutable, hashable, picklable and compare structurally; ``|`` and ``&`` combine them.
    """

    __slots__ = ("_node",)

    _node: _Node

    def __init__(self, expr: str) -> None:
        """Parse ``expr``; same as `Selection.from_string`."""
        if not isinstance(expr, str):
            raise TypeError(f"Selection needs a str expression, got {type(expr).__name__}")
        if len(expr) > _MAX_LENGTH:
            raise ValueError(f"selection expression too long ({len(expr)} characters)")
        node = _Parser(expr).parse()
        if _depth(node) > _MAX_DEPTH:
            raise ValueError(f"invalid selection {expr!r}: nested too deeply")
        object.__setattr__(self, "_node", node)

    @classmethod
    def _of(cls, node: _Node) -> Selection:
        if _depth(node) > _MAX_DEPTH:
            raise ValueError("selection nested too deeply")
        selection = object.__new__(cls)
        object.__setattr__(selection, "_node", node)
        return selection

    @classmethod
    def from_string(cls, expr: str) -> Selection:
        """Parse a selection expression such as ``"(*, 1:3) & (0, *)"``.

        Raises ``ValueError`` naming the position of the first error.
        """
        return cls(expr)

    @classmethod
    def all(cls) -> Selection:
        """Return the selection of every element: ``*``."""
        return cls._of(_All(_TRUE))

    @classmethod
    def any(cls, ndim: int = 1) -> Selection:
        """One index chosen in each of the first ``ndim`` dimensions: ``?, ?, ...``.

        With the default ``ndim=1`` that is one element of a 1-D shape, or one index of the
        first dimension (and everything below it) of a larger shape; pass the shape's
        ``ndim`` to choose exactly one element.
        """
        if ndim < 1:
            raise ValueError(f"Selection.any() needs ndim >= 1, got {ndim}")
        node: _Node = _TRUE
        for _ in range(ndim):
            node = _Any(node)
        return cls._of(node)

    def eval(self, target: Shape | Slice, rng: random.Random | None = None) -> list[int]:
        """Return the base ranks of ``target`` selected, in row-major order.

        ``?`` picks the first index unless ``rng`` is given, in which case it picks with
        ``rng.randrange``. Raises ``ValueError`` if the selection has more dimensions than
        ``target``.
        """
        if isinstance(target, Shape):
            ndslice = target.ndslice
        elif isinstance(target, Slice):
            ndslice = target
        else:
            raise TypeError(f"eval() needs a Shape or Slice, got {type(target).__name__}")
        sizes = ndslice.sizes
        _check_depth(self._node, len(sizes), 0, self)
        if _is_everything(self._node):
            return list(ndslice)
        positions = _Evaluator(sizes, rng).positions(self._node, 0, 0)
        if is_dense(ndslice):
            offset = ndslice.offset  # row-major and contiguous: rank = offset + position
            return [offset + p for p in positions]
        return [ndslice[p] for p in positions]

    def __or__(self, other: Selection) -> Selection:
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection._of(_Union(self._node, other._node))

    def __and__(self, other: Selection) -> Selection:
        if not isinstance(other, Selection):
            return NotImplemented
        return Selection._of(_Intersection(self._node, other._node))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selection):
            return NotImplemented
        return self._node == other._node

    def __hash__(self) -> int:
        return hash(self._node)

    def __str__(self) -> str:
        return _format(self._node)

    def __repr__(self) -> str:
        return f"Selection.from_string({str(self)!r})"

    def __reduce__(self) -> tuple[type[Selection], tuple[str]]:
        return (Selection, (str(self),))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"Selection is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"Selection is immutable; cannot delete {name!r}")
