"""Errors raised by :mod:`regency.shape`.

Only one error type is our own; everything else is a built-in exception, chosen to match
Monarch's (``ValueError``, ``IndexError``, ``TypeError``, ``KeyError``, ``OverflowError``)::

    Exception
     ├── LookupError
     │    └── KeyError ──────────┐
     └── ValueError ─────────────┴── DimensionNotFoundError
"""

from __future__ import annotations

from regency._errors import RegencyError


class DimensionNotFoundError(RegencyError, KeyError, ValueError):
    """A dimension label that the `Extent`, `Point` or `Shape` does not have.

    It is both a `KeyError`, so `Extent` and `Point` behave as proper mappings (``get``,
    ``in``), and a `ValueError`, which is what Monarch raises for an unknown label.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ""
