"""One-sided transfers with ``RDMABuffer``: ``--system regency`` or ``--system monarch``.

Runs the ``rdma`` figure (``figures.fig_rdma``): an owner actor on a fresh proc holds 64 MiB of
random bytes and registers them as an ``RDMABuffer``; this controller, in another process,
times ``buf.read_into(local)`` and ``buf.write_from(local)`` of the whole buffer, and
``np.copyto`` of the same size inside its own process as the baseline. regency is measured with
each backend forced in turn (``cma``, ``shm``, ``tcp``) and with none forced; Monarch with its
default, which on a machine without an RDMA NIC is its TCP fallback. Ray has no equivalent.

Usage: python benchmarks/rdma_bench.py --system regency [--quick] [--progress events.jsonl]
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from actor_bench import MODULES, versions
from benchlib import RDMA_BACKENDS, export_bench_path
from figures import RDMA_FIGURES, RDMAAdapter, main
from rdma_actor import make_owner_class

RDMA_MODULES = {"regency": "regency.rdma", "monarch": "monarch.rdma"}
BACKENDS = {"regency": ("default", *RDMA_BACKENDS), "monarch": ("default",)}
MEMORY = {
    "regency": "numpy uint8 arrays",
    "monarch": "numpy uint8 arrays, passed as memoryviews (Monarch takes tensors or memoryviews)",
}
TRANSFER_TIMEOUT_S = 60


class MeshRDMAAdapter:
    """:class:`figures.RDMAAdapter` over the Monarch API's ``RDMABuffer``."""

    def __init__(self, api: ModuleType, system: str) -> None:
        self._api = api
        self._system = system
        self._rdma = importlib.import_module(RDMA_MODULES[system])
        self._host = api.this_host()
        self._owner_class = make_owner_class(api)
        self.backends = BACKENDS[system]

    @contextmanager
    def owner(self, nbytes: int) -> Iterator[Any]:
        """One fresh proc with the owner actor."""
        procs = self._host.spawn_procs(per_host={"gpus": 1})
        try:
            yield procs.spawn("rdma_owner", self._owner_class, RDMA_MODULES[self._system], nbytes)
        finally:
            procs.stop().get()

    def register(self, owner: Any, backend: str) -> tuple[Any, str]:
        """``owner.register.call_one(backend)``; the buffer's ``backend`` as seen from here."""
        buf = owner.register.call_one(backend).get()
        return buf, str(buf.backend)

    def local(self, array: Any) -> Any:
        """The array itself (regency), or a memoryview of it (Monarch)."""
        return memoryview(array) if self._system == "monarch" else array

    def read_into(self, buf: Any, dst: Any) -> None:
        """``buf.read_into(dst).get()``."""
        buf.read_into(dst, timeout=TRANSFER_TIMEOUT_S).get()

    def write_from(self, buf: Any, src: Any) -> None:
        """``buf.write_from(src).get()``."""
        buf.write_from(src, timeout=TRANSFER_TIMEOUT_S).get()

    def drop(self, buf: Any) -> None:
        """``buf.drop().get()``."""
        buf.drop().get()

    def digest(self, owner: Any) -> str:
        """``owner.digest.call_one().get()``."""
        return str(owner.digest.call_one().get())

    def describe(self) -> dict[str, Any]:
        """``get_rdma_backend()`` in this process, and the kind of memory moved."""
        return {
            "system_backend": str(self._rdma.get_rdma_backend()),
            "memory": MEMORY[self._system],
        }

    def close(self) -> None:
        """``shutdown_context().get()`` where the API has it."""
        shutdown = getattr(self._api, "shutdown_context", None)
        if shutdown is not None:
            shutdown().get()


def connector(system: str) -> Any:
    """Return the function that imports ``system``'s actor API and makes the adapter."""

    def connect() -> tuple[RDMAAdapter, dict[str, Any]]:
        export_bench_path()
        start = time.perf_counter()
        api = importlib.import_module(MODULES[system])
        adapter = MeshRDMAAdapter(api, system)
        # No "metrics" here: import and init times come from actor_bench.py.
        meta = {"versions": versions(system), "rdma_connect_s": time.perf_counter() - start}
        return adapter, meta

    return connect


if __name__ == "__main__":
    sys.exit(main({s: connector(s) for s in MODULES}, figures=RDMA_FIGURES))
