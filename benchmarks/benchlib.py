"""Shared plumbing for the benchmark programs: metric catalogue, statistics, /proc readings.

Imported by the per-system programs (``actor_bench.py``, ``ray_bench.py``), by the figures in
``figures.py`` and by the supervisor and report writer. It depends on the standard library only,
so every peer venv can import it, and so can a regency venv whose runtime does not import yet.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1 << 20
BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


@dataclass(frozen=True)
class Metric:
    """One row of the results table."""

    key: str
    label: str
    unit: str
    higher_is_better: bool


def _payload_metrics() -> tuple[Metric, ...]:
    return tuple(
        Metric(payload_key(kind, mib), f"send {mib} MiB {kind} to an actor", "GB/s", True)
        for kind in ("bytes", "numpy")
        for mib in (1, 16, 128)
    )


def payload_key(kind: str, mib: int) -> str:
    """Return the metric key of the payload figure for ``kind`` and ``mib``."""
    return f"payload_{kind}_{mib}mib_gbps"


def gather_key(n: int) -> str:
    """Return the metric key of the call-and-gather figure on a mesh of ``n`` procs."""
    return f"gather_{n}_ms"


def spawn_key(n: int) -> str:
    """Return the metric key of the spawn figure for ``n`` procs."""
    return f"spawn_{n}_s"


METRICS: tuple[Metric, ...] = (
    Metric("import_s", "import the actor package", "s", False),
    Metric("init_s", "runtime init (first this_host() / ray.init())", "s", False),
    Metric(spawn_key(2), "spawn 2 procs x 1 actor, until first reply", "s", False),
    Metric(spawn_key(8), "spawn 8 procs x 1 actor, until first reply", "s", False),
    Metric("call_one_median_us", "call_one round trip, median", "µs", False),
    Metric("call_one_p99_us", "call_one round trip, p99", "µs", False),
    Metric("call_one_steal_ms", "hypervisor steal time during the call_one samples", "ms", False),
    Metric("pipelined_calls_per_s", "10k pipelined call_one to one actor", "calls/s", True),
    *(
        Metric(gather_key(n), f"call + gather on {n} procs, median", "ms", False)
        for n in (2, 4, 8, 16)
    ),
    Metric("broadcasts_per_s", "10k broadcasts to 4 actors, then one call", "bcast/s", True),
    *_payload_metrics(),
    Metric("rss_worker_median_mib", "RSS per worker proc (8 procs), median", "MiB", False),
    Metric("rss_controller_mib", "RSS of the controller process", "MiB", False),
    Metric("rss_tree_total_mib", "RSS of controller + all descendants (8 procs)", "MiB", False),
)
METRIC_KEYS = frozenset(m.key for m in METRICS)

# The fault-detection figure (``fault_bench.py``, ``ray_fault_bench.py``): its own table.
FAULT_METRICS: tuple[Metric, ...] = (
    Metric("fault_future_median_ms", "SIGKILL → pending future raises, median", "ms", False),
    Metric("fault_future_max_ms", "SIGKILL → pending future raises, max", "ms", False),
    Metric("fault_supervise_median_ms", "SIGKILL → owner's `__supervise__`, median", "ms", False),
    Metric("fault_supervise_max_ms", "SIGKILL → owner's `__supervise__`, max", "ms", False),
)

# The RDMA figure (``rdma_bench.py``): its own table. regency forces each of its backends in
# turn; "default" is what a transfer uses when nothing is forced (regency: cma here; Monarch:
# its TCP fallback on a machine without an RDMA NIC).
RDMA_BACKENDS = ("cma", "shm", "tcp")
RDMA_OPS = ("read", "write")


def rdma_key(backend: str, op: str) -> str:
    """Return the metric key of ``read_into`` / ``write_from`` (``op``) over ``backend``."""
    return f"rdma_{backend}_{op}_gbps"


def median(samples: Sequence[float]) -> float:
    """Return the median of ``samples``."""
    return float(statistics.median(samples))


def percentile(samples: Sequence[float], q: float) -> float:
    """Return the nearest-rank ``q``-th percentile (0 < q <= 100) of ``samples``."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def steal_ms() -> float | None:
    """CPU time the hypervisor has taken from this machine's CPUs so far (all of them, the
    ``steal`` column of ``/proc/stat``), in ms; ``None`` where it cannot be read. A round trip
    that a steal lands on waits for it: on a VM this, not the code, makes most of a p99."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def rss_mib(pid: int) -> float | None:
    """Return the resident set size of ``pid`` in MiB, or None if it has gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def _parent_map() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name sits in parentheses and may contain spaces; ppid follows it.
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Return every live process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def rss_summary(worker_pids: Iterable[int]) -> dict[str, float | None]:
    """Return the RSS figures for the given worker pids and this process's tree."""
    me = os.getpid()
    worker_rss = [r for r in (rss_mib(p) for p in set(worker_pids)) if r is not None]
    tree_rss = [r for r in (rss_mib(p) for p in [me, *descendants(me)]) if r is not None]
    return {
        "rss_worker_median_mib": median(worker_rss) if worker_rss else None,
        "rss_controller_mib": rss_mib(me),
        "rss_tree_total_mib": sum(tree_rss),
    }


def read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Read the complete JSON lines that ``path`` gained after ``offset``; return the new offset."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()], offset + end


class EventLog:
    """Append-only JSON-lines progress file that the supervisor polls."""

    def __init__(self, path: Path | None) -> None:
        self._path = path

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event, flushed at once so that a killed run keeps it."""
        if self._path is None:
            return
        with self._path.open("a") as f:
            f.write(json.dumps({"event": event, **fields}) + "\n")


def export_bench_path() -> None:
    """Put this folder on PYTHONPATH so that worker processes can import ``bench_actor``."""
    current = os.environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p]
    if str(BENCH_DIR) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), *parts])


def describe(exc: BaseException, limit: int = 600) -> str:
    """Return a one-line description of ``exc`` for the results' error notes."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def display_path(path: Path) -> str:
    """Return ``path`` relative to the repository root when it lies inside it."""
    absolute = Path(os.path.abspath(path))
    return str(absolute.relative_to(REPO_ROOT)) if absolute.is_relative_to(REPO_ROOT) else str(path)
