"""pyverbs itself: importing it on first use, its errors, and its objects across a fork.

pyverbs is rdma-core's Python bindings (not on PyPI; Debian/Ubuntu ``python3-pyverbs``). Nothing
imports it until ibverbs is first considered in a process. Its errors become this backend's:
:class:`IbvUnavailableError` where another backend should take over, an ``OSError`` subclass in
the middle of a transfer.

Fork: a child shares the parent's verbs objects through the inherited device file, so it must
neither use nor destroy them. Every verbs object this backend makes is tracked; just before a
fork the live ones are held, and the child makes them immortal (a destructor run in the child
could destroy the parent's object). Caches of verbs objects start afresh in the child.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

from regency._errors import RegencyError
from regency.rdma._ibverbs.status import IbvCompletionError

log = logging.getLogger("regency.rdma")

_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = (ctypes.py_object,)
_incref.restype = None


class IbvUnavailableError(RegencyError, RuntimeError):
    """ibverbs cannot serve this transfer; another backend should.

    ``lasting`` says whether the reason holds for every later transfer to the same owner (no
    route between the ports, an owner without a device) or only for this one (memory that
    could not be registered).
    """

    def __init__(self, why: str, *, lasting: bool) -> None:
        super().__init__(why)
        self.lasting = lasting


class Pyverbs(NamedTuple):
    """The pyverbs modules, imported together on first use."""

    addr: Any
    cq: Any
    device: Any
    enums: Any
    error: type[Exception]
    fork: Any
    mr: Any
    pd: Any
    qp: Any
    wr: Any


@functools.lru_cache(maxsize=1)
def _modules() -> Pyverbs:
    import pyverbs.addr
    import pyverbs.cq
    import pyverbs.device
    import pyverbs.enums
    import pyverbs.fork
    import pyverbs.mr
    import pyverbs.pd
    import pyverbs.qp
    import pyverbs.wr
    from pyverbs.pyverbs_error import PyverbsError

    return Pyverbs(
        pyverbs.addr,
        pyverbs.cq,
        pyverbs.device,
        pyverbs.enums,
        PyverbsError,
        pyverbs.fork,
        pyverbs.mr,
        pyverbs.pd,
        pyverbs.qp,
        pyverbs.wr,
    )


def load() -> Pyverbs:
    """The pyverbs modules this backend uses (``IbvUnavailableError`` if pyverbs is missing)."""
    try:
        return _modules()
    except ImportError as exc:
        raise IbvUnavailableError(
            f"pyverbs is not importable here ({exc}); install rdma-core's Python bindings "
            "(Debian/Ubuntu: python3-pyverbs)",
            lasting=True,
        ) from exc


def _is_verbs_error(exc: BaseException) -> bool:
    try:
        return isinstance(exc, _modules().error)
    except ImportError:
        return False


@contextlib.contextmanager
def verbs_errors(what: str, *, lasting: bool) -> Iterator[None]:
    """Report a pyverbs error raised inside as :class:`IbvUnavailableError` ("``what``: ...")."""
    try:
        yield
    except Exception as exc:
        if not _is_verbs_error(exc):
            raise
        raise IbvUnavailableError(f"{what}: {exc}", lasting=lasting) from exc


@contextlib.contextmanager
def data_path_errors(what: str) -> Iterator[None]:
    """Report a pyverbs error raised inside (posting, polling) as an :class:`IbvCompletionError`."""
    try:
        yield
    except Exception as exc:
        if not _is_verbs_error(exc):
            raise
        raise IbvCompletionError(f"{what}: {exc}") from exc


def close_quietly(obj: Any) -> None:
    """Close a verbs object on a path that must go on (teardown); a failure is logged."""
    try:
        obj.close()
    except Exception:
        log.exception("closing an RDMA %s failed", type(obj).__name__)


_live_lock = threading.Lock()
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_fork_guard: list[Any] = []


def track(obj: Any) -> Any:
    """Record a new verbs object (so that a fork leaves it alone); returns it."""
    with _live_lock:
        _live.add(obj)
    return obj


def immortal(obj: Any) -> Any:
    """Keep ``obj`` alive for the life of the process (its destructor never runs); returns it."""
    _incref(obj)
    return obj


def _before_fork() -> None:
    _live_lock.acquire()
    _fork_guard[:] = list(_live)


def _after_fork_in_parent() -> None:
    _fork_guard.clear()
    _live_lock.release()


def _after_fork_in_child() -> None:
    global _live_lock, _live
    for obj in _fork_guard:
        _incref(obj)  # never deallocated here: its destructor would act on the parent's object
    _fork_guard.clear()
    _live_lock, _live = threading.Lock(), weakref.WeakSet()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
