"""Durations written as Monarch writes them (Rust's ``humantime``): ``"30s"``, ``"1m 30s"``.

:func:`parse` reads ``"300s"``, ``"1.5s"``, ``"5 minutes"`` or ``"1h30m"`` into nanoseconds;
:func:`format` writes nanoseconds back in the normal form (``"5m"``, ``"1s 500ms"``), so a
configured duration reads back the way Monarch shows it.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NS = 1
_US = 1_000
_MS = 1_000_000
_S = 1_000_000_000
_MIN = 60 * _S
_H = 60 * _MIN
_DAY = 24 * _H
_MONTH = 2_630_016 * _S  # 30.44 days, as humantime counts a month
_YEAR = 31_557_600 * _S  # 365.25 days

_UNITS: dict[str, int] = {
    **dict.fromkeys(("nanos", "nsec", "ns"), _NS),
    **dict.fromkeys(("usec", "us", "µs"), _US),
    **dict.fromkeys(("millis", "msec", "ms"), _MS),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), _S),
    **dict.fromkeys(("minutes", "minute", "mins", "min", "m"), _MIN),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), _H),
    **dict.fromkeys(("days", "day", "d"), _DAY),
    **dict.fromkeys(("weeks", "week", "w"), 7 * _DAY),
    **dict.fromkeys(("months", "month", "M"), _MONTH),
    **dict.fromkeys(("years", "year", "y"), _YEAR),
}
_TERM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-zµ]+)")

# (size, singular, plural) from the largest unit down, as humantime writes them.
_FORMAT = (
    (_YEAR, "year", "years"),
    (_MONTH, "month", "months"),
    (_DAY, "day", "days"),
    (_H, "h", "h"),
    (_MIN, "m", "m"),
    (_S, "s", "s"),
    (_MS, "ms", "ms"),
    (_US, "us", "us"),
    (_NS, "ns", "ns"),
)


def parse(text: str) -> int:
    """Nanoseconds in ``text``; ``ValueError`` saying what is wrong for anything else."""
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"Invalid duration format {text!r}: value was empty")
    total = Fraction(0)
    pos = 0
    while pos < len(stripped):
        match = _TERM.match(stripped, pos)
        if match is None:
            if stripped[pos:].strip().replace(".", "", 1).isdigit():
                raise ValueError(
                    f"Invalid duration format {text!r}: time unit needed, for example 5sec or 5ms"
                )
            raise ValueError(f"Invalid duration format {text!r}: expected number at {pos}")
        number, unit = match.groups()
        if unit not in _UNITS:
            raise ValueError(f"Invalid duration format {text!r}: unknown time unit {unit!r}")
        total += Fraction(number) * _UNITS[unit]
        pos = match.end()
    return int(total)


def format(nanos: int) -> str:
    """``nanos`` in humantime's normal form: ``"0s"``, ``"5m"``, ``"1h 1m"``, ``"1day"``."""
    if nanos == 0:
        return "0s"
    parts = []
    rest = nanos
    for size, singular, plural in _FORMAT:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{singular if count == 1 else plural}")
    return " ".join(parts)
