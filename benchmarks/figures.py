"""The benchmark figures, written once against a small adapter that each system implements.

``actor_bench.py`` implements :class:`Adapter` with the Monarch actor API (for both regency and
torchmonarch) and ``ray_bench.py`` with Ray; :func:`main` is their shared command line. A run
prints one JSON object to stdout and, with ``--progress``, appends JSON-lines events that the
supervisor (``harness.py``) polls to enforce a timeout per figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchlib import (
    MIB,
    EventLog,
    describe,
    gather_key,
    median,
    payload_key,
    percentile,
    rss_summary,
    spawn_key,
)


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
        )


Metrics = dict[str, float | None]


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
        samples = round_trips(a, group, plan.round_trips)
    return {
        "call_one_median_us": median(samples) * 1e6,
        "call_one_p99_us": percentile(samples, 99) * 1e6,
    }


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


@dataclass(frozen=True)
class Figure:
    """A unit of work with its own timeout; it produces one or more metrics."""

    name: str
    run: Callable[[Adapter, Plan], Metrics]
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
FIGURE_NAMES = tuple(f.name for f in FIGURES)
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


def parse_args(systems: Sequence[str], argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line shared by the benchmark programs."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=systems, required=len(systems) > 1, default=systems[0])
    parser.add_argument(
        "--figures",
        default=",".join(FIGURE_NAMES),
        help="comma-separated subset of: " + ", ".join(FIGURE_NAMES),
    )
    parser.add_argument("--progress", type=Path, help="append JSON-lines progress events here")
    parser.add_argument("--quick", action="store_true", help="about ten times fewer iterations")
    return parser.parse_args(argv)


def run_figure(figure: Figure, adapter: Adapter, plan: Plan, out: Outcome, log: EventLog) -> None:
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


def main(connectors: Mapping[str, Connect], argv: Sequence[str] | None = None) -> int:
    """Connect to the ``--system`` chosen among ``connectors``, run the figures, print JSON."""
    args = parse_args(list(connectors), argv)
    by_name = {f.name: f for f in FIGURES}
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
