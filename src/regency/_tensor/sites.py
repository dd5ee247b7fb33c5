"""Controller call sites of commands, captured cheaply: the code object and line of the first
frame outside torch and regency, interned to a small integer that travels with the command."""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType

import torch

_SKIP = (
    os.path.dirname(torch.__file__),
    os.path.dirname(os.path.dirname(__file__)),
    threading.__file__,
)
_ids: dict[tuple[CodeType, int], int] = {}
_sites: list[tuple[CodeType, int]] = []
_standing_in = threading.local()


def capture() -> int:
    """The id of the user's frame that led to this call (-1 when there is none, or the site
    a helper thread stands in for)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return getattr(_standing_in, "site", -1)
    key = (frame.f_code, frame.f_lineno)
    site = _ids.get(key)
    if site is None:
        site = len(_sites)
        _ids[key] = site
        _sites.append(key)
    return site


@contextmanager
def standing_in(site: int) -> Iterator[None]:
    """In this thread, commands with no user frame on the stack (a helper thread's, such as
    ``grad_generator``'s backward) are attributed to ``site``."""
    _standing_in.site = site
    try:
        yield
    finally:
        del _standing_in.site


def count() -> int:
    """How many call sites were captured so far (their ids are ``0 .. count() - 1``)."""
    return len(_sites)


def describe(site: int) -> str:
    """``File "...", line N, in fn`` and the source line, as a traceback shows it."""
    if not 0 <= site < len(_sites):
        return "(no controller call site)"
    code, line = _sites[site]
    text = linecache.getline(code.co_filename, line).strip()
    where = f'File "{code.co_filename}", line {line}, in {code.co_name}'
    return f"{where}\n    {text}" if text else where
