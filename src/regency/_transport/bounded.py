"""Records of processes that are gone, kept to a bounded size.

A long-lived controller spawns and stops procs without end; what it remembers about each ended
one (why it ended, that its address must not be dialed again) must not grow with them.
:class:`BoundedDict` keeps the newest :data:`GONE_LIMIT` entries and forgets the oldest: a call
to a process forgotten that way still fails, only after the connect timeout rather than at once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

GONE_LIMIT = 8192


class BoundedDict(OrderedDict[K, V]):
    """A dict that forgets its oldest entries beyond ``limit`` (insertion order)."""

    def __init__(self, limit: int = GONE_LIMIT) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        while len(self) > self.limit:
            self.popitem(last=False)
