"""Benchmark Ray actors on the same figures as ``actor_bench.py``.

A "proc mesh of N procs with one actor each" is N ``@ray.remote`` actors (Ray runs each actor in
its own worker process); ``call`` is a list of ``.remote()`` calls and one ``ray.get``,
``call_one`` is ``actor.method.remote()``, ``broadcast`` is one ``.remote()`` per actor whose
reference is dropped. Actors ask for ``num_cpus=0`` so that 16 of them fit on a 2-core machine,
as Monarch's procs do. ``init_s`` is ``ray.init()`` (which starts the GCS, raylet and workers).

Usage: python benchmarks/ray_bench.py [--quick] [--figures spawn,call_one] [--progress FILE]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from bench_actor import BenchBehavior
from benchlib import export_bench_path
from figures import Adapter, main


class RayAdapter:
    """:class:`figures.Adapter` over Ray actors, one per worker process."""

    def __init__(self, ray: ModuleType) -> None:
        self._ray = ray
        self._actor_class = ray.remote(num_cpus=0)(BenchBehavior)

    @contextmanager
    def spawn(self, n: int) -> Iterator[list[Any]]:
        """Create ``n`` actors; kill them on exit."""
        actors = [self._actor_class.remote() for _ in range(n)]
        try:
            yield actors
        finally:
            for actor in actors:
                self._ray.kill(actor)

    def call(self, group: list[Any], method: str, *args: Any) -> list[Any]:
        """``ray.get([actor.method.remote(*args) for actor in group])``."""
        return list(self._ray.get([getattr(a, method).remote(*args) for a in group]))

    def call_one(self, group: list[Any], method: str, *args: Any) -> Any:
        """``actor.method.remote(*args)`` on the group's single actor."""
        (actor,) = group
        return getattr(actor, method).remote(*args)

    def wait(self, future: Any) -> Any:
        """``ray.get(ref)``."""
        return self._ray.get(future)

    def wait_all(self, futures: list[Any]) -> list[Any]:
        """``ray.get(refs)``: Ray's batch wait."""
        return list(self._ray.get(futures))

    def broadcast(self, group: list[Any], method: str) -> None:
        """One ``.remote()`` per actor, references dropped."""
        for actor in group:
            getattr(actor, method).remote()

    def close(self) -> None:
        """``ray.shutdown()``."""
        self._ray.shutdown()


def connect() -> tuple[Adapter, dict[str, Any]]:
    """Import Ray and start a local cluster."""
    export_bench_path()
    start = time.perf_counter()
    import ray

    imported = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    meta = {
        "versions": {"python": sys.version.split()[0], "ray": ray.__version__},
        "metrics": {"import_s": imported - start, "init_s": time.perf_counter() - imported},
    }
    return RayAdapter(ray), meta


if __name__ == "__main__":
    sys.exit(main({"ray": connect}))
