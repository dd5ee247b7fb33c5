"""``ranks(...)`` of the debugger's ``cast`` command, as in Monarch's ``monarch debug``.

- ``ranks(3)``: one rank; ``ranks(0,1,5)``: a list; ``ranks(2:7:2)``: a range as in Python's
  slices (each part optional, so ``ranks(:)`` is every rank);
- ``ranks(hosts=1, gpus=0:2)``: by coordinates, each dimension a rank, a range, or a list in
  brackets (``gpus=[0,3]``); dimensions left out match every coordinate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from regency._errors import RegencyError

_RANKS = re.compile(r"^ranks\((?P<body>[^()]*)\)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RankSpecError(RegencyError, ValueError):
    """A ``ranks(...)`` that cannot be read; the text says what is wrong."""


@dataclass(frozen=True)
class RankSpec:
    """Which ranks a ``cast`` goes to: by flat rank, or by coordinates."""

    text: str
    _flat: Callable[[int], bool] | None
    _dims: Mapping[str, Callable[[int], bool]]

    def matches(self, rank: int, coords: Mapping[str, int]) -> bool:
        """Whether the rank ``rank`` at ``coords`` is chosen; an unknown dimension chooses none."""
        if self._flat is not None:
            return self._flat(rank)
        return all(dim in coords and test(coords[dim]) for dim, test in self._dims.items())


def _number(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RankSpecError(f"{text.strip()!r} in {where} is not a number") from None


def _range(text: str, where: str) -> Callable[[int], bool]:
    parts = text.split(":")
    if len(parts) > 3:
        raise RankSpecError(f"{text!r} in {where}: a range is start:stop:step")
    start, stop, step = ([_number(p, where) if p.strip() else None for p in parts] + [None])[:3]
    if step is not None and step <= 0:
        raise RankSpecError(f"{text!r} in {where}: the step must be positive")
    first = start or 0
    stride = step or 1

    def chosen(i: int) -> bool:
        return i >= first and (stop is None or i < stop) and (i - first) % stride == 0

    return chosen


def _values(text: str, where: str) -> Callable[[int], bool]:
    """One rank, a range, or a list of ranks (``a,b,c``)."""
    text = text.strip()
    if not text:
        raise RankSpecError(f"{where} is empty")
    if ":" in text:
        return _range(text, where)
    wanted = frozenset(_number(part, where) for part in text.split(","))
    return wanted.__contains__


def _split_dims(body: str) -> list[str]:
    """``hosts=1, gpus=[0,2]`` split at the commas outside brackets."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in body:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    return items


def parse_ranks(text: str) -> RankSpec:
    """Read a ``ranks(...)``; :class:`RankSpecError` names what is wrong."""
    match = _RANKS.match(text.strip())
    if match is None:
        raise RankSpecError(
            f"{text!r} is not ranks(...): e.g. ranks(0,1), ranks(2:7:2), ranks(hosts=1, gpus=0:2)"
        )
    body = match.group("body").strip()
    if "=" not in body:
        return RankSpec(text, _values(body, text), {})
    dims: dict[str, Callable[[int], bool]] = {}
    for item in _split_dims(body):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            raise RankSpecError(f"{item.strip()!r} in {text} is not DIM=RANKS")
        if name in dims:
            raise RankSpecError(f"dimension {name!r} is given twice in {text}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        dims[name] = _values(value, f"{name}= of {text}")
    return RankSpec(text, None, dims)
