"""Fault detection with Ray actors: the ``fault_detect`` figure of ``fault_bench.py``.

(a) The driver calls ``victim.sleep.remote(...)`` on a ``@ray.remote`` actor, SIGKILLs the
actor's worker process and times until ``ray.get(ref)`` raises (``ActorDiedError``, a
``RayActorError``). (b) Ray has no ``__supervise__``: the closest equivalent is the actor's
owner (the actor that created it, Ray's ownership model) learning of the death through its own
pending call. An owner actor creates the victim, starts its ``sleep`` and waits in
``ray.get(ref)`` on a thread of its own; when that raises it records the time. Both
actors ask for ``num_cpus=0``, as in ``ray_bench.py``; each trial creates fresh ones.

Usage: python benchmarks/ray_fault_bench.py [--quick] [--progress FILE]
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from benchlib import export_bench_path
from fault_actor import VICTIM_NAME, VictimBehavior, record_failure
from figures import FAULT_FIGURES, FaultAdapter, main


class RayFaultOwner:
    """Creates a victim actor (so owns it) and learns of its death through ``ray.get``."""

    def __init__(self, stamp: str) -> None:
        import ray

        self._stamp = stamp
        self._victim = ray.remote(num_cpus=0)(VictimBehavior).remote()

    def arm(self, marker: str, seconds: float) -> int:
        """Start the victim's ``sleep`` and a thread blocked on its result; return its pid."""
        import ray

        pid = int(ray.get(self._victim.pid.remote()))
        ref = self._victim.sleep.remote(marker, seconds)
        threading.Thread(target=self._watch, args=(ref,), daemon=True).start()
        return pid

    def _watch(self, ref: Any) -> None:
        import ray

        try:
            ray.get(ref)
        except Exception as exc:
            record_failure(self._stamp, VICTIM_NAME, f"{type(exc).__name__}: {exc}")


class RayFaultAdapter:
    """:class:`figures.FaultAdapter` over Ray actors."""

    max_trials = None

    def __init__(self, ray: ModuleType) -> None:
        self._ray = ray
        self._victim_class = ray.remote(num_cpus=0)(VictimBehavior)
        self._owner_class = ray.remote(num_cpus=0)(RayFaultOwner)

    @contextmanager
    def _killed_on_exit(self, actor: Any) -> Iterator[Any]:
        try:
            yield actor
        finally:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)

    @contextmanager
    def pending_call(self, marker: str, seconds: float) -> Iterator[tuple[int, Any]]:
        """A fresh victim actor and the ref of its ``sleep`` call."""
        with self._killed_on_exit(self._victim_class.remote()) as victim:
            pid = int(self._ray.get(victim.pid.remote()))
            yield pid, victim.sleep.remote(marker, seconds)

    def wait_failure(self, future: Any, timeout_s: float) -> BaseException:
        """``ray.get(ref, timeout=...)``, which must raise."""
        try:
            value = self._ray.get(future, timeout=timeout_s)
        except Exception as exc:
            return exc
        raise AssertionError(f"the killed actor's call returned {value!r}")

    @contextmanager
    def owned_victim(self, marker: str, stamp: str, seconds: float) -> Iterator[int]:
        """A fresh owner actor, which creates the victim and watches its pending call."""
        with self._killed_on_exit(self._owner_class.remote(stamp)) as owner:
            yield int(self._ray.get(owner.arm.remote(marker, seconds)))

    def close(self) -> None:
        """``ray.shutdown()``."""
        self._ray.shutdown()


def connect() -> tuple[FaultAdapter, dict[str, Any]]:
    """Import Ray and start a local cluster."""
    export_bench_path()
    start = time.perf_counter()
    import ray

    ray.init(include_dashboard=False, log_to_driver=False)
    meta = {
        "versions": {"python": sys.version.split()[0], "ray": ray.__version__},
        "fault_connect_s": time.perf_counter() - start,
    }
    return RayFaultAdapter(ray), meta


if __name__ == "__main__":
    sys.exit(main({"ray": connect}, figures=FAULT_FIGURES))
