"""Meshes handed to a second controller process through ``multiprocessing``.

A mesh pickled by ``multiprocessing`` (the arguments of a ``spawn`` ``Process``, a ``Queue``,
a ``Pipe``) also carries this controller's secret, so the receiving process, a second
controller of the same user, can join: it boots its runtime with that secret, which the
sender's procs accept. Pickles made any other way (``pickle``, the codec of actor messages, a
file) never carry the secret. The receiver must not have started its own runtime yet (it holds
another secret then, which the sender's procs refuse): unpickling raises ``RuntimeError``
saying so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

from regency._runtime.kernel import state


def carry_secret(*classes: type) -> None:
    """Make ``multiprocessing`` pickle instances of ``classes`` with the controller's secret."""
    for cls in classes:
        ForkingPickler.register(cls, _reduce_with_secret)


def _reduce_with_secret(obj: Any) -> tuple[Any, ...]:
    rebuild, args = obj.__reduce__()[:2]
    return (_join_then, (state.runtime().secret, os.getpid(), rebuild, args))


def _join_then(
    secret: bytes, sender: int, rebuild: Callable[..., Any], args: tuple[Any, ...]
) -> Any:
    """Join the sender's controller (the secret its procs accept), then rebuild the mesh."""
    if not state.adopt_secret(secret):
        raise RuntimeError(
            f"cannot use a mesh of the regency controller in process {sender} here: this process "
            "already holds another controller's secret (it started its own regency runtime, or "
            "received a mesh of another controller, before this one), and that controller's "
            "procs accept only their own controller's secret. Pass the mesh to this process "
            "before it uses regency (e.g. as an argument of the multiprocessing Process)."
        )
    return rebuild(*args)
