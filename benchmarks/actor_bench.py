"""Benchmark the Monarch actor API: ``--system regency`` or ``--system monarch``.

regency implements ``monarch.actor``'s names and semantics, so one program measures both: it
imports ``regency.actor`` or ``monarch.actor`` and drives it through the same calls
(``this_host().spawn_procs``, ``procs.spawn``, ``call``, ``call_one``, ``broadcast``).

Usage: python benchmarks/actor_bench.py --system monarch [--quick] [--figures spawn,call_one]
[--progress events.jsonl]
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from bench_actor import ENDPOINTS, BenchBehavior
from benchlib import export_bench_path
from figures import Adapter, Connect, main

MODULES = {"regency": "regency.actor", "monarch": "monarch.actor"}
DISTRIBUTIONS = {"regency": ("regency",), "monarch": ("torchmonarch", "torch")}


def make_actor_class(api: ModuleType) -> type:
    """Wrap :class:`BenchBehavior` into an ``Actor`` subclass whose methods are endpoints."""
    namespace: dict[str, Any] = {"__init__": BenchBehavior.__init__}
    namespace.update({name: api.endpoint(getattr(BenchBehavior, name)) for name in ENDPOINTS})
    return type("BenchActor", (api.Actor, BenchBehavior), namespace)


class MeshAdapter:
    """:class:`figures.Adapter` over ``this_host()`` proc meshes, one actor per proc."""

    def __init__(self, api: ModuleType) -> None:
        self._api = api
        self._host = api.this_host()
        self._actor_class = make_actor_class(api)

    @contextmanager
    def spawn(self, n: int) -> Iterator[Any]:
        """Spawn ``n`` procs (``per_host={"gpus": n}``) and one actor on each."""
        procs = self._host.spawn_procs(per_host={"gpus": n})
        try:
            yield procs.spawn("bench", self._actor_class)
        finally:
            procs.stop().get()

    def call(self, group: Any, method: str, *args: Any) -> list[Any]:
        """``mesh.method.call(*args).get()``, as a list of values."""
        return list(getattr(group, method).call(*args).get().values())

    def call_one(self, group: Any, method: str, *args: Any) -> Any:
        """``mesh.method.call_one(*args)`` on a single-actor mesh."""
        return getattr(group, method).call_one(*args)

    def wait(self, future: Any) -> Any:
        """``future.get()``."""
        return future.get()

    def wait_all(self, futures: list[Any]) -> list[Any]:
        """``get()`` every future in order (the API has no batch wait)."""
        return [f.get() for f in futures]

    def broadcast(self, group: Any, method: str) -> None:
        """``mesh.method.broadcast()``: fire and forget."""
        getattr(group, method).broadcast()

    def close(self) -> None:
        """``shutdown_context().get()`` where the API has it."""
        shutdown = getattr(self._api, "shutdown_context", None)
        if shutdown is not None:
            shutdown().get()


def versions(system: str) -> dict[str, str]:
    """Return the installed versions of the distributions behind ``system``."""
    found = {"python": sys.version.split()[0]}
    for dist in DISTRIBUTIONS[system]:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def connector(system: str) -> Connect:
    """Return the function that imports ``system``'s actor API and bootstraps its client."""

    def connect() -> tuple[Adapter, dict[str, Any]]:
        export_bench_path()
        start = time.perf_counter()
        api = importlib.import_module(MODULES[system])
        imported = time.perf_counter()
        adapter = MeshAdapter(api)
        meta = {
            "versions": versions(system),
            "metrics": {"import_s": imported - start, "init_s": time.perf_counter() - imported},
        }
        return adapter, meta

    return connect


if __name__ == "__main__":
    sys.exit(main({system: connector(system) for system in MODULES}))
