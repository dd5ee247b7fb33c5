"""``Uid`` and ``ProcId``: Monarch's identity value types.

A ``Uid`` is a label, an instance number, or both, written ``label<N>`` (``N`` in base 58),
``<N>`` or ``label``; a ``ProcId`` names a proc by its ``Uid``.
"""

from __future__ import annotations

import os
from typing import Any

_B58 = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"  # the Flickr alphabet


def _b58(value: int) -> str:
    digits = ""
    while True:
        value, rest = divmod(value, 58)
        digits = _B58[rest] + digits
        if not value:
            return digits


def _from_b58(text: str) -> int | None:
    value = 0
    for char in text:
        digit = _B58.find(char)
        if digit < 0:
            return None
        value = value * 58 + digit
    return value


class Uid:
    """A unique id: ``label<N>`` (an instance), ``<N>`` (anonymous) or ``label`` (singleton)."""

    __slots__ = ("_label", "_value")
    _label: str | None
    _value: int | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("cannot create 'Uid' instances; use Uid.from_string or Uid.instance")

    @classmethod
    def _make(cls, label: str | None, value: int | None) -> Uid:
        uid = object.__new__(cls)
        uid._label = label
        uid._value = value
        return uid

    @classmethod
    def from_string(cls, text: str) -> Uid:
        """Parse ``label<N>``, ``<N>`` or ``label``."""
        head, sep, tail = text.partition("<")
        if sep and tail.endswith(">"):
            value = _from_b58(tail[:-1])
            if value is not None:
                return cls._make(head or None, value)
        return cls._make(text, None)

    @classmethod
    def instance(cls, label: str | None = None) -> Uid:
        """A fresh random instance id, with an optional label."""
        return cls._make(label, int.from_bytes(os.urandom(8), "big"))

    @classmethod
    def anonymous(cls) -> Uid:
        """A fresh random instance id without a label."""
        return cls.instance()

    @classmethod
    def instance_from_value(cls, value: int, label: str | None = None) -> Uid:
        """The instance id with number ``value``."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"argument 'value': {type(value).__name__!r} object cannot be interpreted as an "
                "integer"
            )
        return cls._make(label, value)

    @property
    def label(self) -> str | None:
        """The label, if any."""
        return self._label

    @property
    def is_singleton(self) -> bool:
        """Whether this is a label without an instance number."""
        return self._value is None

    @property
    def is_instance(self) -> bool:
        """Whether this has an instance number."""
        return self._value is not None

    @property
    def instance_value(self) -> int | None:
        """The instance number, if any."""
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return self._label or ""
        return f"{self._label or ''}<{_b58(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uid) and (self._label, self._value) == (
            other._label,
            other._value,
        )

    def __hash__(self) -> int:
        return hash((self._label, self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Uid.from_string, (str(self),))


class ProcId:
    """The identity of a proc: its :class:`Uid`."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        if not isinstance(uid, Uid):
            kind = type(uid).__name__
            raise TypeError(f"argument 'uid': {kind!r} object cannot be cast as 'Uid'")
        self._uid = uid

    @classmethod
    def from_string(cls, text: str) -> ProcId:
        """Parse a proc id written as its uid."""
        return cls(Uid.from_string(text))

    @property
    def uid(self) -> Uid:
        """The proc's uid."""
        return self._uid

    @property
    def label(self) -> str | None:
        """The uid's label."""
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and self._uid == other._uid

    def __hash__(self) -> int:
        return hash(self._uid)
