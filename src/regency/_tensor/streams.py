"""Streams on the controller: ``Stream(name)``, ``stream.activate()``, ``get_active_stream()``.

Every mesh tensor belongs to the stream that was active when it was made; an op runs on the
active stream and may use only tensors of that stream (``borrow`` hands one to another stream).
Each stream has its own tensor-worker actor per proc, so different streams run concurrently
(each actor has its own thread) and one stream runs strictly in order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_NAME = "main"
"""The name of the default stream (Monarch's too), and the key of its workers."""

_ids: list[Iterator[int]] = []
"""The numbers of the streams after the default one (empty until the default is made)."""
IN_USE: list[bool] = []
"""Non-empty once a stream other than the default exists: the access checks run from then on."""
BORROW: list[Callable[[Stream, Any, bool], tuple[Any, Any]]] = []
"""``borrows.borrow``, registered by that module (which builds on this one), returning
``(t2, Borrow)``."""


class Stream:
    """A named stream of work on every proc of a mesh (``Stream("comms")``).

    Ops issued inside ``with stream.activate():`` run on this stream's worker of each proc, in
    order among themselves and concurrently with other streams. ``borrow`` shares a tensor of
    another stream with this one.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = DEFAULT_NAME if not _ids else f"s{next(_ids[0])}"
        """What the workers know this stream by (unique: two streams may share a name)."""
        if _ids:
            IN_USE[:] = [True]
        else:
            _ids.append(itertools.count(1))

    def __repr__(self) -> str:
        return f"<Stream({self.name!r}) at {hex(id(self))}>"

    @contextmanager
    def activate(self) -> Iterator[Stream]:
        """Make this the active stream for the block."""
        _active.append(self)
        try:
            yield self
        finally:
            _active.pop()

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Any]:
        """``(t2, borrow)``: ``t2`` is ``t``'s value, usable on this stream until
        ``borrow.drop()`` (or the end of ``with borrow:``).

        It is made on the workers once ``t``'s stream has computed ``t`` (this stream waits for
        that point, not for the whole stream). While borrowed, ``t`` may be read but not
        mutated; with ``mutable=True`` this stream may write ``t2`` and ``t`` may not be used at
        all. ``t``'s stream waits for the drop before its next mutation of ``t`` (before its
        next use of any kind after a mutable borrow).
        """
        return BORROW[0](self, t, mutable)


_default = Stream(DEFAULT_NAME)
_active: list[Stream] = [_default]


def get_active_stream() -> Stream:
    """The stream of the innermost ``stream.activate()`` block (the default stream ``main``
    outside any)."""
    return _active[-1]


def default_stream() -> Stream:
    """The default stream, where tensors are made unless another stream is active."""
    return _default
