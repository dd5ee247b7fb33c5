"""The benchmark figures, written once against a small adapter that each system implements.

``actor_bench.py`` implements :class:`Adapter` with the Monarch actor API (for both regency and
torchmonarch) and ``ray_bench.py`` with Ray; :func:`main` is their shared command line. A run
prints one JSON object to stdout and, with ``--progress``, appends JSON-lines events that the
supervisor (``harness.py``) polls to enforce a timeout per figure.

The fault-detection figure kills processes, so it runs in programs of its own, against
:class:`FaultAdapter`: ``fault_bench.py`` (Monarch API) and ``ray_fault_bench.py`` (Ray).
The RDMA figure runs in ``rdma_bench.py`` against :class:`RDMAAdapter` (Ray has no equivalent).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchlib import (
    MIB,
    RDMA_OPS,
    EventLog,
    describe,
    gather_key,
    median,
    payload_key,
    percentile,
    rdma_key,
    rss_summary,
    spawn_key,
    steal_ms,
)
from fault_actor import VICTIM_NAME, read_failures


class Adapter(Protocol):
    """What the figures need from an actor system."""

    def spawn(self, n: int) -> AbstractContextManager[Any]:
        """Start ``n`` worker procs with one benchmark actor each; stop them on exit."""
        ...

    def call(self, group: Any, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every actor of ``group`` and return all the replies."""
        ...

    def call_one(self, group: Any, method: str, *args: Any) -> Any:
        """Send ``method`` to the single actor of ``group``; return a future of its reply."""
        ...

    def wait(self, future: Any) -> Any:
        """Block for one future from :meth:`call_one`."""
        ...

    def wait_all(self, futures: list[Any]) -> list[Any]:
        """Block for many futures from :meth:`call_one`, the system's idiomatic way."""
        ...

    def broadcast(self, group: Any, method: str) -> None:
        """Send ``method`` to every actor of ``group`` without waiting for anything."""
        ...

    def close(self) -> None:
        """Shut the runtime down."""
        ...


@dataclass(frozen=True)
class Plan:
    """Iteration counts of every figure; :meth:`quick` is a smoke-test sized copy."""

    settle_s: float = 2.0
    spawn_sizes: tuple[int, ...] = (2, 8)
    spawn_reps: int = 3
    warmup: int = 200
    round_trips: int = 2000
    pipelined_calls: int = 10_000
    gather_sizes: tuple[int, ...] = (2, 4, 8, 16)
    gather_warmup: int = 20
    gather_iters: int = 200
    broadcasts: int = 10_000
    broadcast_actors: int = 4
    payload_mib: tuple[int, ...] = (1, 16, 128)
    payload_reps: int = 5
    rss_procs: int = 8
    fault_trials: int = 10
    fault_wait_s: float = 30.0
    fault_sleep_s: float = 60.0
    rdma_mib: int = 64
    rdma_reps: int = 15
    multihost_procs: int = 4
    host_loss_trials: int = 5
    heartbeat_timeout_s: float = 2.0
    host_loss_wait_s: float = 30.0

    @classmethod
    def quick(cls) -> Plan:
        """Return a plan about ten times cheaper, for checking that the harness works."""
        return dataclasses.replace(
            cls(),
            settle_s=0.5,
            spawn_reps=1,
            warmup=20,
            round_trips=200,
            pipelined_calls=1000,
            gather_sizes=(2, 4),
            gather_warmup=2,
            gather_iters=20,
            broadcasts=1000,
            payload_mib=(1, 16),
            payload_reps=2,
            fault_trials=2,
            rdma_reps=3,
            host_loss_trials=2,
        )


# Figures' values are floats (None when missing); the fault figure also records its raw
# samples (a list) and notes (strings) under keys that the tables do not show.
Metrics = dict[str, Any]


def elapsed(fn: Callable[[], object]) -> float:
    """Return how many seconds ``fn()`` took."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spawn_until_reply(a: Adapter, n: int) -> float:
    """Time spawning ``n`` procs with one actor each until every actor has replied once."""
    start = time.perf_counter()
    with a.spawn(n) as group:
        a.call(group, "ping")
        return time.perf_counter() - start


def fig_spawn(a: Adapter, plan: Plan) -> Metrics:
    """Spawn figures: median over ``spawn_reps`` of spawn-until-first-reply."""
    return {
        spawn_key(n): median([spawn_until_reply(a, n) for _ in range(plan.spawn_reps)])
        for n in plan.spawn_sizes
    }


def round_trips(a: Adapter, group: Any, n: int) -> list[float]:
    """Return the latencies of ``n`` sequential ``ping`` round trips."""
    return [elapsed(lambda: a.wait(a.call_one(group, "ping"))) for _ in range(n)]


def fig_call_one(a: Adapter, plan: Plan) -> Metrics:
    """Sequential call_one round trip to one actor in another proc, after a warmup."""
    with a.spawn(1) as group:
        round_trips(a, group, plan.warmup)
        stolen = steal_ms()
        samples = round_trips(a, group, plan.round_trips)
        stolen_after = steal_ms()
    metrics = {
        "call_one_median_us": median(samples) * 1e6,
        "call_one_p99_us": percentile(samples, 99) * 1e6,
    }
    if stolen is not None and stolen_after is not None:
        metrics["call_one_steal_ms"] = stolen_after - stolen
    return metrics


def fig_pipelined(a: Adapter, plan: Plan) -> Metrics:
    """Issue ``pipelined_calls`` call_one futures to one actor, then wait for all of them."""
    n = plan.pipelined_calls
    with a.spawn(1) as group:
        round_trips(a, group, plan.warmup)
        start = time.perf_counter()
        replies = a.wait_all([a.call_one(group, "ping") for _ in range(n)])
        seconds = time.perf_counter() - start
    if len(replies) != n:
        raise AssertionError(f"expected {n} replies, got {len(replies)}")
    return {"pipelined_calls_per_s": n / seconds}


def gather_median_ms(a: Adapter, n: int, plan: Plan) -> float:
    """Median time of call-and-gather of ``ping`` on a fresh mesh of ``n`` procs."""
    with a.spawn(n) as group:
        for _ in range(plan.gather_warmup):
            a.call(group, "ping")
        return median([elapsed(lambda: a.call(group, "ping")) for _ in range(plan.gather_iters)])


def fig_gather(a: Adapter, plan: Plan) -> Metrics:
    """Call + gather on meshes of each of ``gather_sizes`` procs."""
    return {gather_key(n): gather_median_ms(a, n, plan) * 1e3 for n in plan.gather_sizes}


def fig_broadcast(a: Adapter, plan: Plan) -> Metrics:
    """Fire ``broadcasts`` broadcasts at a mesh, then one call that must see all of them."""
    n = plan.broadcasts
    with a.spawn(plan.broadcast_actors) as group:
        a.call(group, "ping")
        start = time.perf_counter()
        for _ in range(n):
            a.broadcast(group, "incr")
        counts = a.call(group, "total")
        seconds = time.perf_counter() - start
    if counts != [n] * plan.broadcast_actors:
        raise AssertionError(f"expected every actor to count {n}, got {counts}")
    return {"broadcasts_per_s": n / seconds}


def make_payload(kind: str, nbytes: int) -> Any:
    """Return ``nbytes`` random bytes as ``bytes`` or as a uint8 numpy array."""
    data = os.urandom(nbytes)
    if kind == "bytes":
        return data
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)


def send_gbps(a: Adapter, group: Any, payload: Any, nbytes: int, reps: int) -> float:
    """Median GB/s (1e9 bytes/s) of sending ``payload`` to the actor and getting its size."""

    def once() -> None:
        size = a.wait(a.call_one(group, "payload_len", payload))
        if size != nbytes:
            raise AssertionError(f"actor saw {size} bytes, sent {nbytes}")

    once()
    return nbytes / median([elapsed(once) for _ in range(reps)]) / 1e9


def payload_figure(kind: str) -> Callable[[Adapter, Plan], Metrics]:
    """Return the figure that sends 1/16/128 MiB payloads of ``kind`` to an actor."""

    def fig(a: Adapter, plan: Plan) -> Metrics:
        metrics: Metrics = {}
        with a.spawn(1) as group:
            for mib in plan.payload_mib:
                payload = make_payload(kind, mib * MIB)
                metrics[payload_key(kind, mib)] = send_gbps(
                    a, group, payload, mib * MIB, plan.payload_reps
                )
        return metrics

    return fig


def fig_rss(a: Adapter, plan: Plan) -> Metrics:
    """RSS of ``rss_procs`` idle worker procs, of this controller and of the whole tree."""
    with a.spawn(plan.rss_procs) as group:
        return rss_summary(a.call(group, "pid"))


class FaultAdapter(Protocol):
    """What the fault-detection figure needs from an actor system."""

    max_trials: int | None
    """Cap on the trials of each kind (for a system that takes seconds per trial), or None."""

    def pending_call(self, marker: str, seconds: float) -> AbstractContextManager[tuple[int, Any]]:
        """Spawn a fresh proc with a victim actor and call its ``sleep(marker, seconds)``.

        Yield ``(pid of the victim's process, the pending call's future)``; stop it all on exit.
        """
        ...

    def wait_failure(self, future: Any, timeout_s: float) -> BaseException:
        """Block on ``future``; return the exception it raised (a timeout counts as one)."""
        ...

    def owned_victim(self, marker: str, stamp: str, seconds: float) -> AbstractContextManager[int]:
        """Spawn a fresh owner that spawns a victim and starts its ``sleep(marker, seconds)``.

        The owner appends a record to ``stamp`` (``fault_actor.record_failure``) when it learns
        of the victim's failure. Yield the victim's pid; stop it all on exit.
        """
        ...

    def close(self) -> None:
        """Shut the runtime down."""
        ...


def await_path(path: Path, timeout_s: float) -> bool:
    """Poll (every millisecond) until ``path`` exists; False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def sigkill(pid: int) -> float:
    """SIGKILL ``pid``; return the wall-clock time just before the signal was sent."""
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed_at


def future_trial(a: FaultAdapter, plan: Plan, marker: Path) -> tuple[float | None, str]:
    """Kill a victim in a pending call; return (seconds until the future raised, the error)."""
    with a.pending_call(str(marker), plan.fault_sleep_s) as (pid, future):
        if not await_path(marker, plan.fault_wait_s):
            raise AssertionError("the victim's sleep call never started")
        killed_at = sigkill(pid)
        error = a.wait_failure(future, plan.fault_wait_s)
        seconds = time.time() - killed_at
    if seconds >= plan.fault_wait_s:  # whatever the system's timeout error is called
        return None, f"timed out after {plan.fault_wait_s:g} s ({describe(error, 200)})"
    return seconds, describe(error, 300)


def victim_record(stamp: Path, timeout_s: float) -> dict[str, Any] | None:
    """Poll ``stamp`` until the owner recorded the victim mesh's failure; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() <= deadline:
        for record in read_failures(stamp):
            if str(record["mesh"]).startswith(VICTIM_NAME):
                return record
        time.sleep(0.001)
    return None


def supervise_trial(
    a: FaultAdapter, plan: Plan, marker: Path, stamp: Path
) -> tuple[float | None, list[dict[str, Any]]]:
    """Kill an owner's victim; return (seconds until the owner learnt of it, every record)."""
    with a.owned_victim(str(marker), str(stamp), plan.fault_sleep_s) as pid:
        if not await_path(marker, plan.fault_wait_s):
            raise AssertionError("the victim's sleep call never started")
        killed_at = sigkill(pid)
        record = victim_record(stamp, plan.fault_wait_s)
        records = [{**r, "after_ms": (r["t"] - killed_at) * 1e3} for r in read_failures(stamp)]
    return (None if record is None else record["t"] - killed_at), records


def fault_stats(prefix: str, samples: list[float | None], cap_s: float) -> Metrics:
    """Median and max in ms over ``samples``, a timed-out trial (None) counting as ``cap_s``."""
    done = sorted(s for s in samples if s is not None)
    ranked = done + [cap_s] * (len(samples) - len(done))
    return {
        f"{prefix}_median_ms": median(ranked) * 1e3,
        f"{prefix}_max_ms": ranked[-1] * 1e3,
        f"{prefix}_trials": float(len(samples)),
        f"{prefix}_timeouts": float(len(samples) - len(done)),
        f"{prefix}_samples_ms": [None if s is None else round(s * 1e3, 3) for s in samples],
    }


def fig_fault_detect(a: FaultAdapter, plan: Plan) -> Metrics:
    """SIGKILL a victim's process; time until its caller's future fails and until its owner
    learns of it (``__supervise__``). Every trial spawns fresh procs."""
    trials = plan.fault_trials if a.max_trials is None else min(plan.fault_trials, a.max_trials)
    futures: list[float | None] = []
    supervised: list[float | None] = []
    errors: list[str] = []
    meshes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fault-bench-") as tmp:
        work = Path(tmp)
        for i in range(trials):
            seconds, error = future_trial(a, plan, work / f"future-{i}.started")
            futures.append(seconds)
            errors.append(error)
        for i in range(trials):
            seconds, records = supervise_trial(
                a, plan, work / f"owned-{i}.started", work / f"owned-{i}.jsonl"
            )
            supervised.append(seconds)
            meshes += [f"{r['mesh']} at {r['after_ms']:.1f} ms" for r in records]
    return {
        **fault_stats("fault_future", futures, plan.fault_wait_s),
        **fault_stats("fault_supervise", supervised, plan.fault_wait_s),
        "fault_wait_s": plan.fault_wait_s,
        "fault_future_error_types": sorted({e.split(":", 1)[0] for e in errors}),
        "fault_future_error_example": errors[0] if errors else None,
        "fault_supervise_records": meshes,
    }


class RDMAAdapter(Protocol):
    """What the RDMA figure needs from a system with one-sided buffers (``RDMABuffer``)."""

    backends: tuple[str, ...]
    """What to measure: ``"default"`` (nothing forced) and each backend that can be forced."""

    def owner(self, nbytes: int) -> AbstractContextManager[Any]:
        """Spawn a fresh proc with an owner actor holding ``nbytes`` random bytes (uint8).

        Yield the owner (for :meth:`register` and :meth:`digest`); stop it all on exit.
        """
        ...

    def register(self, owner: Any, backend: str) -> tuple[Any, str]:
        """Have the owner wrap its memory in an ``RDMABuffer`` over ``backend``.

        Return ``(the buffer, as received here; the backend its transfers from here use)``.
        """
        ...

    def local(self, array: Any) -> Any:
        """Return what the system's transfers take for a local uint8 numpy ``array``."""
        ...

    def read_into(self, buf: Any, dst: Any) -> None:
        """``buf.read_into(dst)`` and wait for it."""
        ...

    def write_from(self, buf: Any, src: Any) -> None:
        """``buf.write_from(src)`` and wait for it."""
        ...

    def drop(self, buf: Any) -> None:
        """``buf.drop()`` and wait for it."""
        ...

    def digest(self, owner: Any) -> str:
        """Return the SHA-256 (hex) of the owner's memory, computed in the owner's process."""
        ...

    def describe(self) -> dict[str, Any]:
        """Return notes for the results: the backend the system reports here, the memory kind."""
        ...

    def close(self) -> None:
        """Shut the runtime down."""
        ...


def random_bytes(nbytes: int) -> Any:
    """Return ``nbytes`` random bytes as a writable uint8 numpy array."""
    import numpy as np

    return np.random.default_rng().integers(0, 256, nbytes, dtype=np.uint8)


def sha256(array: Any) -> str:
    """Return the SHA-256 (hex) of a contiguous array's bytes."""
    return hashlib.sha256(memoryview(array).cast("B")).hexdigest()


def gbps_samples(nbytes: int, fn: Callable[[], object], reps: int) -> list[float]:
    """Run ``fn`` once as a warm-up, then ``reps`` times timed; return each run's GB/s."""
    fn()
    return [nbytes / elapsed(fn) / 1e9 for _ in range(reps)]


def copy_gbps(nbytes: int, reps: int) -> list[float]:
    """GB/s of ``np.copyto`` between two ``nbytes`` uint8 arrays of this process."""
    import numpy as np

    src, dst = random_bytes(nbytes), np.empty(nbytes, dtype=np.uint8)
    samples = gbps_samples(nbytes, lambda: np.copyto(dst, src), reps)
    if not np.array_equal(dst, src):
        raise AssertionError("np.copyto left the destination different from the source")
    return samples


def rdma_backend(a: RDMAAdapter, owner: Any, backend: str, plan: Plan) -> Metrics:
    """Time ``read_into`` and then ``write_from`` of the owner's whole buffer over ``backend``.

    The destination is zeroed before every timed read (untimed) and the reads are checked
    against the owner's digest; every write sends fresh random bytes, checked the same way.
    """
    import numpy as np

    nbytes = plan.rdma_mib * MIB
    buf, used = a.register(owner, backend)
    dst_array = np.empty(nbytes, dtype=np.uint8)
    src_array = random_bytes(nbytes)
    dst, src = a.local(dst_array), a.local(src_array)

    reads: list[float] = []
    for _ in range(plan.rdma_reps + 1):  # the first is an untimed warm-up
        dst_array.fill(0)
        reads.append(nbytes / elapsed(lambda: a.read_into(buf, dst)) / 1e9)
    reads = reads[1:]
    if sha256(dst_array) != a.digest(owner):
        raise AssertionError(f"{backend}: read_into delivered bytes that differ from the owner's")
    writes = gbps_samples(nbytes, lambda: a.write_from(buf, src), plan.rdma_reps)
    if a.digest(owner) != sha256(src_array):
        raise AssertionError(f"{backend}: after write_from the owner's bytes differ from ours")
    metrics: Metrics = {f"rdma_{backend}_used": used}
    for op, samples in zip(RDMA_OPS, (reads, writes), strict=True):
        metrics[rdma_key(backend, op)] = median(samples)
        metrics[f"rdma_{backend}_{op}_samples_gbps"] = [round(s, 3) for s in samples]
    try:
        a.drop(buf)
    except Exception as exc:  # the numbers stand; say that the drop failed
        metrics[f"rdma_{backend}_drop_error"] = describe(exc, 300)
    if backend == "default":
        metrics.update(rdma_end_to_end(a, owner, dst_array, plan))
    return metrics


def rdma_end_to_end(a: RDMAAdapter, owner: Any, dst_array: Any, plan: Plan) -> Metrics:
    """A buffer's whole life, timed: the owner registers it and returns it, one ``read_into``
    of all of it, ``drop`` (issue 17: at least half the steady-state read rate)."""
    nbytes = plan.rdma_mib * MIB
    dst = a.local(dst_array)
    # Where each of the three steps spends its time, per cycle (ms).
    steps: list[tuple[float, float, float]] = []

    def cycle() -> None:
        start = time.perf_counter()
        buf, _ = a.register(owner, "default")
        registered = time.perf_counter()
        a.read_into(buf, dst)
        read = time.perf_counter()
        a.drop(buf)
        steps.append((registered - start, read - registered, time.perf_counter() - read))

    samples = gbps_samples(nbytes, cycle, plan.rdma_reps)
    if sha256(dst_array) != a.digest(owner):
        raise AssertionError("end to end: read_into delivered bytes that differ from the owner's")
    timed = steps[1:]  # the first is the warm-up
    return {
        "rdma_e2e_read_gbps": median(samples),
        "rdma_e2e_read_samples_gbps": [round(s, 3) for s in samples],
        **{
            f"rdma_e2e_{step}_ms": median([t[i] * 1e3 for t in timed])
            for i, step in enumerate(("register", "read", "drop"))
        },
    }


def fig_rdma(a: RDMAAdapter, plan: Plan) -> Metrics:
    """``read_into`` / ``write_from`` of a ``rdma_mib`` MiB buffer owned by an actor on another
    proc, by this controller, for each backend; and the in-process ``np.copyto`` baseline."""
    nbytes = plan.rdma_mib * MIB
    copies = copy_gbps(nbytes, plan.rdma_reps)
    metrics: Metrics = {
        "rdma_copy_gbps": median(copies),
        "rdma_copy_samples_gbps": [round(s, 3) for s in copies],
        "rdma_mib": float(plan.rdma_mib),
        "rdma_reps": float(plan.rdma_reps),
        "rdma_backends": list(a.backends),
        **{f"rdma_{k}": v for k, v in a.describe().items()},
    }
    with a.owner(nbytes) as owner:
        for backend in a.backends:
            metrics.update(rdma_backend(a, owner, backend, plan))
    return metrics


class MultihostAdapter(Protocol):
    """What the multi-host figures need (regency only: ``multihost_bench.py``)."""

    def hosts(self) -> tuple[str, str]:
        """What the worker hosts of ``spawn("tcp")`` and ``host_loss`` are: a kind
        (``"netns"``: network namespaces; ``"process"``: ProcessJob workers) and a note."""
        ...

    def spawn(self, where: str, n: int) -> AbstractContextManager[Any]:
        """``n`` benchmark actors spread over two hosts: ``"tcp"`` (two worker hosts, see
        :meth:`hosts`) or ``"local"`` (``this_host()``, unix sockets); yields ``(mesh, one)``,
        ``one`` being a single actor (on the second host for ``"tcp"``)."""
        ...

    def call(self, group: Any, method: str) -> list[Any]:
        """Call ``method`` on every actor of ``group`` and return all the replies."""
        ...

    def call_one(self, group: Any, method: str) -> Any:
        """Send ``method`` to the single actor of ``group``; return a future of its reply."""
        ...

    def wait(self, future: Any) -> Any:
        """Block for one future from :meth:`call_one`."""
        ...

    def slurm_first_reply(self) -> tuple[float | None, str]:
        """Seconds from ``SlurmJob.state()`` to an actor's first reply, or None and why not."""
        ...

    def host_loss(self, heartbeat_timeout_s: float, wait_s: float) -> tuple[float, str]:
        """Cut a worker host off under a pending call (its link down on namespace hosts, else
        SIGSTOP of its worker and procs); seconds until the call's future fails, and the
        error."""
        ...

    def close(self) -> None:
        """Shut the runtime down."""
        ...


def fig_multihost_calls(a: MultihostAdapter, plan: Plan) -> Metrics:
    """call_one round trip and call+gather over 4 procs: two worker hosts (TCP) vs this host."""
    metrics: Metrics = {}
    for where in ("local", "tcp"):
        with a.spawn(where, plan.multihost_procs) as (mesh, one):
            round_trips(a, one, plan.warmup)  # type: ignore[arg-type]
            samples = round_trips(a, one, plan.round_trips)  # type: ignore[arg-type]
            for _ in range(plan.gather_warmup):
                a.call(mesh, "ping")
            gathers = [elapsed(lambda: a.call(mesh, "ping")) for _ in range(plan.gather_iters)]
        metrics[f"mh_{where}_call_one_median_us"] = median(samples) * 1e6
        metrics[f"mh_{where}_call_one_p99_us"] = percentile(samples, 99) * 1e6
        metrics[f"mh_{where}_gather_median_ms"] = median(gathers) * 1e3
    metrics["mh_procs"] = plan.multihost_procs
    metrics["mh_hosts"], metrics["mh_hosts_note"] = a.hosts()
    return metrics


def fig_multihost_slurm(a: MultihostAdapter, plan: Plan) -> Metrics:
    """Seconds from ``SlurmJob.state()`` to the first reply, or the reason it was skipped."""
    seconds, note = a.slurm_first_reply()
    return {"mh_slurm_first_reply_s": seconds, "mh_slurm_note": note}


def fig_host_loss(a: MultihostAdapter, plan: Plan) -> Metrics:
    """Cut a worker host off under a pending call: time until the future fails."""
    samples, errors = [], []
    for _ in range(plan.host_loss_trials):
        seconds, error = a.host_loss(plan.heartbeat_timeout_s, plan.host_loss_wait_s)
        samples.append(seconds)
        errors.append(error)
    return {
        "host_loss_median_ms": median(samples) * 1e3,
        "host_loss_max_ms": max(samples) * 1e3,
        "host_loss_trials": len(samples),
        "host_loss_heartbeat_timeout_s": plan.heartbeat_timeout_s,
        "host_loss_samples_ms": [s * 1e3 for s in samples],
        "host_loss_error_example": errors[0] if errors else None,
        "host_loss_hosts": a.hosts()[0],
    }


@dataclass(frozen=True)
class Figure:
    """A unit of work with its own timeout; it produces one or more metrics."""

    name: str
    run: Callable[[Any, Plan], Metrics]  # takes an Adapter, or a FaultAdapter (FAULT_FIGURES)
    timeout_s: float


FIGURES: tuple[Figure, ...] = (
    Figure("spawn", fig_spawn, 240),
    Figure("rss", fig_rss, 120),
    Figure("call_one", fig_call_one, 120),
    Figure("pipelined", fig_pipelined, 180),
    Figure("gather", fig_gather, 300),
    Figure("broadcast", fig_broadcast, 180),
    Figure("payload_bytes", payload_figure("bytes"), 240),
    Figure("payload_numpy", payload_figure("numpy"), 240),
)
# Run by the fault programs (fault_bench.py, ray_fault_bench.py), not by the programs above.
# Monarch takes about 10 s per trial: 3 trials of each kind, each capped at fault_wait_s.
FAULT_FIGURES: tuple[Figure, ...] = (Figure("fault_detect", fig_fault_detect, 480),)
# Run by rdma_bench.py (regency and Monarch; Ray has no RDMABuffer).
RDMA_FIGURES: tuple[Figure, ...] = (Figure("rdma", fig_rdma, 240),)
# Run by multihost_bench.py (regency only): worker hosts (netns or ProcessJob), Slurm, host loss.
MULTIHOST_FIGURES: tuple[Figure, ...] = (
    Figure("multihost_calls", fig_multihost_calls, 180),
    Figure("multihost_slurm", fig_multihost_slurm, 180),
    Figure("host_loss", fig_host_loss, 240),
)
ACTOR_FIGURE_NAMES = tuple(f.name for f in FIGURES)
FAULT_FIGURE_NAMES = tuple(f.name for f in FAULT_FIGURES)
RDMA_FIGURE_NAMES = tuple(f.name for f in RDMA_FIGURES)
MULTIHOST_FIGURE_NAMES = tuple(f.name for f in MULTIHOST_FIGURES)
FIGURE_NAMES = ACTOR_FIGURE_NAMES + FAULT_FIGURE_NAMES + RDMA_FIGURE_NAMES + MULTIHOST_FIGURE_NAMES
STARTUP_TIMEOUT_S = 180.0


@dataclass
class Outcome:
    """The JSON object a benchmark program prints."""

    system: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: Metrics = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    figure_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


Connect = Callable[[], tuple[Adapter, dict[str, Any]]]


def parse_args(
    systems: Sequence[str], argv: Sequence[str] | None, names: Sequence[str] = ACTOR_FIGURE_NAMES
) -> argparse.Namespace:
    """Parse the command line shared by the benchmark programs."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=systems, required=len(systems) > 1, default=systems[0])
    parser.add_argument(
        "--figures",
        default=",".join(names),
        help="comma-separated subset of: " + ", ".join(names),
    )
    parser.add_argument("--progress", type=Path, help="append JSON-lines progress events here")
    parser.add_argument("--quick", action="store_true", help="about ten times fewer iterations")
    return parser.parse_args(argv)


def run_figure(figure: Figure, adapter: Any, plan: Plan, out: Outcome, log: EventLog) -> None:
    """Run one figure, recording its metrics or its error in ``out`` and in ``log``."""
    log.emit("start", figure=figure.name)
    start = time.perf_counter()
    try:
        metrics = figure.run(adapter, plan)
    except Exception as exc:
        out.errors[figure.name] = describe(exc)
        log.emit("error", figure=figure.name, error=out.errors[figure.name])
        return
    seconds = time.perf_counter() - start
    out.metrics.update(metrics)
    out.figure_seconds[figure.name] = seconds
    log.emit("done", figure=figure.name, metrics=metrics, seconds=seconds)


def main(
    connectors: Mapping[str, Callable[[], tuple[Any, dict[str, Any]]]],
    argv: Sequence[str] | None = None,
    figures: Sequence[Figure] = FIGURES,
) -> int:
    """Connect to the ``--system`` chosen among ``connectors``, run the figures, print JSON.

    ``figures`` is the program's catalogue: :data:`FIGURES`, :data:`FAULT_FIGURES` or
    :data:`RDMA_FIGURES` or :data:`MULTIHOST_FIGURES`.
    """
    args = parse_args(list(connectors), argv, [f.name for f in figures])
    by_name = {f.name: f for f in figures}
    selected = [by_name[name] for name in args.figures.split(",") if name]
    plan = Plan.quick() if args.quick else Plan()
    log, out = EventLog(args.progress), Outcome(args.system)
    try:
        adapter, out.meta = connectors[args.system]()
    except Exception as exc:
        error = f"runtime failed to start: {describe(exc)}"
        for figure in selected:
            out.errors[figure.name] = error
            log.emit("error", figure=figure.name, error=error)
        print(json.dumps(dataclasses.asdict(out)), flush=True)
        return 1
    out.metrics.update(out.meta.get("metrics", {}))
    log.emit("meta", meta=out.meta)
    time.sleep(plan.settle_s)
    for figure in selected:
        run_figure(figure, adapter, plan, out, log)
    adapter.close()
    print(json.dumps(dataclasses.asdict(out)), flush=True)
    return 0
