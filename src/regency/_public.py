"""How a public package presents what it re-exports (Trio's ``fixup_module_metadata``).

Each public package (``regency.actor``, ``regency.job``, ``regency.rdma``, ``regency.shape``,
``regency.spmd``, ``regency.config``, ``regency``) imports its names explicitly from the private
modules that define them, lists them in ``__all__``, and ends with::

    _public.publish(__name__, globals())

so that ``repr()``, tracebacks, docs and pickles name ``regency.actor.Actor`` rather than
``regency._runtime.actors.base.endpoint_def.Actor``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping


def is_private(module: str) -> bool:
    """Whether a dotted module name has a private part (``regency._runtime.x``)."""
    return any(part.startswith("_") for part in module.split("."))


def publish(module: str, namespace: Mapping[str, object]) -> None:
    """Make ``module`` the ``__module__`` of each class and function it exports from private code.

    ``namespace`` is the public module's ``globals()``; its ``__all__`` lists the exports (a name
    loaded lazily, through the module's ``__getattr__``, is not there yet and is skipped). Pickle
    finds a class or function by ``__module__`` and name, so only an object exported under its
    own ``__name__`` is changed (an alias such as ``unhandled_fault_hook = default_hook`` keeps
    its module), and one that another public module already claimed keeps that one.
    """
    names = namespace.get("__all__", ())
    assert isinstance(names, list | tuple)
    for name in names:
        obj = namespace.get(name)
        if not isinstance(obj, type | types.FunctionType):
            continue
        if obj.__name__ == name and is_private(obj.__module__):
            obj.__module__ = module
