"""How cost grows with the mesh: call + gather latency and broadcast throughput (issue 17,
target 6), on this machine's procs and on network-namespace hosts.

*local*: meshes of 1, 2, 4, ..., 256 procs of ``this_host()``, one benchmark actor each
(``bench_actor.py``). *hosts*: 1 to 8 network-namespace hosts (``tests/multihost/netns.py``,
one worker daemon each, attached with ``attach_to_workers``; needs root), ``--per-host`` procs
on each, so the casts cross TCP. For every mesh, fresh:

- *spawn*: ``spawn_procs``, ``spawn`` and a first ``ping.call()``, in seconds;
- *gather*: warm-ups, then ``G`` timed ``mesh.ping.call().get()`` (a reply from every actor,
  merged up the casting tree): median and 90th percentile in ms, and the CPU time the
  controller and all the procs spent per call (summed over their threads, from
  ``/proc/PID/task/*/schedstat``), which shows the work the wall time hides;
- *broadcast*: ``K`` times ``mesh.incr.broadcast()`` then ``mesh.total.call()``, which must
  report all ``K`` from every actor: broadcasts/s and deliveries/s (``K·N`` per elapsed).

``--rounds R`` repeats the sweep, sizes ascending in even rounds and descending in odd ones, so
that the machine's changing load does not fall on the large meshes alone; the figures are the
medians over the rounds. For every curve the output has two least-squares fits over N, ``a +
b·log2 N`` and ``a + b·N``, with their R². ``scale_plot.py`` draws the curves.

Usage: .venv/bin/python benchmarks/scale_bench.py [--local 1,2,...,256] [--hosts 1,...,8]
       [--per-host 4] [--rounds 3] [--json results/scale.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actor_bench import make_actor_class
from benchlib import export_bench_path, percentile

LOCAL = (1, 2, 4, 8, 16, 32, 64, 128, 256)
HOSTS = (1, 2, 3, 4, 5, 6, 7, 8)
METRICS = (
    "spawn_s",
    "gather_median_ms",
    "gather_p90_ms",
    "gather_controller_cpu_us",
    "gather_procs_cpu_us",
    "broadcasts_per_s",
    "deliveries_per_s",
)
STOP_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 120.0


def cpu_ns(pids: list[int]) -> int:
    """CPU time (ns) all threads of ``pids`` have run, from ``/proc/PID/task/*/schedstat``."""
    total = 0
    for pid in pids:
        tasks = f"/proc/{pid}/task"
        try:
            tids = os.listdir(tasks)
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open(f"{tasks}/{tid}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue
    return total


def gather_reps(n: int) -> int:
    """Timed gathers for a mesh of ``n``: 200 for small meshes, at least 30 for large ones."""
    return max(30, min(200, 2000 // n))


def broadcast_count(n: int) -> int:
    """Broadcasts for a mesh of ``n``: about 40k deliveries, between 200 and 5,000 casts."""
    return max(200, min(5000, 40000 // n))


def measure_mesh(spawn: Callable[[], tuple[Any, Any]], n: int) -> dict[str, float]:
    """Spawn a mesh of ``n`` actors with ``spawn()`` (returns ``(procs, mesh)``), measure it."""
    start = time.perf_counter()
    procs, mesh = spawn()
    try:
        mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        figures = {"spawn_s": time.perf_counter() - start}
        pids = [int(p) for p in mesh.pid.call().get(timeout=CALL_TIMEOUT_S).values()]
        if len(set(pids)) != n:
            raise AssertionError(f"expected {n} procs, the mesh answered from {len(set(pids))}")
        for _ in range(max(5, gather_reps(n) // 10)):
            mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        reps = gather_reps(n)
        times = []
        mine, theirs = cpu_ns([os.getpid()]), cpu_ns(pids)
        for _ in range(reps):
            begin = time.perf_counter()
            values = mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
            times.append(time.perf_counter() - begin)
        figures["gather_controller_cpu_us"] = (cpu_ns([os.getpid()]) - mine) / reps / 1e3
        figures["gather_procs_cpu_us"] = (cpu_ns(pids) - theirs) / reps / 1e3
        if len(list(values.values())) != n:
            raise AssertionError(f"a gather over {n} actors returned {len(values)} values")
        figures["gather_median_ms"] = statistics.median(times) * 1e3
        figures["gather_p90_ms"] = percentile(times, 90) * 1e3
        before = sum(mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())
        count = broadcast_count(n)
        begin = time.perf_counter()
        for _ in range(count):
            mesh.incr.broadcast()
        totals = list(mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())
        seconds = time.perf_counter() - begin
        if sum(totals) - before != count * n:
            raise AssertionError(f"{count} broadcasts to {n} actors: {sum(totals) - before} came")
        figures["broadcasts_per_s"] = count / seconds
        figures["deliveries_per_s"] = count * n / seconds
        return figures
    finally:
        procs.stop().get(timeout=STOP_TIMEOUT_S)


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares ``a + b·x`` through the points: a, b and R²."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"a": a, "b": b, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def fits(sizes: list[int], medians: dict[int, dict[str, float]]) -> dict[str, Any]:
    """For each metric, the fits ``a + b·log2 N`` and ``a + b·N`` over the measured sizes, and
    ``power``: ``log2 y = a + b·log2 N``, whose ``b`` is the exponent k of ``y ~ N^k`` (over all
    sizes, and from 16 on as ``power_from_16``)."""
    if len(sizes) < 3:
        return {}
    out = {}
    for metric in METRICS:
        ys = [medians[n][metric] for n in sizes]
        out[metric] = {
            "log2N": fit([math.log2(n) for n in sizes], ys),
            "N": fit([float(n) for n in sizes], ys),
            "power": fit([math.log2(n) for n in sizes], [math.log2(y) for y in ys]),
        }
        large = [n for n in sizes if n >= 16]
        if len(large) >= 3:
            logs = [math.log2(medians[n][metric]) for n in large]
            out[metric]["power_from_16"] = fit([math.log2(n) for n in large], logs)
    return out


def sweep(
    sizes: tuple[int, ...], rounds: int, measure: Callable[[int], dict[str, float]], label: str
) -> dict[str, Any]:
    """Measure every size ``rounds`` times (alternating the order); medians and fits."""
    runs: dict[int, list[dict[str, float]]] = {n: [] for n in sizes}
    loads = []
    for index in range(rounds):
        for n in sizes if index % 2 == 0 else tuple(reversed(sizes)):
            runs[n].append(measure(n))
            loads.append(round(os.getloadavg()[0], 2))
            print(f"{label} round {index} size {n}: {runs[n][-1]}", file=sys.stderr, flush=True)
    medians = {
        n: {m: statistics.median(r[m] for r in rs) for m in METRICS} for n, rs in runs.items()
    }
    return {
        "sizes": list(sizes),
        "runs": {str(n): rs for n, rs in runs.items()},
        "medians": {str(n): m for n, m in medians.items()},
        "fits": fits(list(sizes), medians),
        "load_average_after_each_mesh": loads,
    }


@contextmanager
def namespace_hosts(count: int) -> Iterator[Any]:
    """``count`` namespace hosts with a worker each, attached (``multihost_bench.netns_hosts``)."""
    from multihost_bench import netns_hosts, netns_unavailable

    why = netns_unavailable()
    if why is not None:
        raise RuntimeError(f"namespace hosts are unavailable: {why}")
    with netns_hosts(count) as (_, hosts):
        yield hosts


def main() -> None:
    """Parse the command line, run the sweeps, print (and write) the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", default=",".join(map(str, LOCAL)), help="proc counts, or ''")
    parser.add_argument("--hosts", default=",".join(map(str, HOSTS)), help="host counts, or ''")
    parser.add_argument("--per-host", type=int, default=4, help="procs per namespace host")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    export_bench_path()
    import regency.actor as api

    actor = make_actor_class(api)
    result: dict[str, Any] = {"per_host": args.per_host, "rounds": args.rounds}
    local = tuple(int(n) for n in args.local.split(",") if n)
    if local:

        def on_this_host(n: int) -> dict[str, float]:
            def spawn() -> tuple[Any, Any]:
                procs = api.this_host().spawn_procs(per_host={"gpus": n})
                return procs, procs.spawn("bench", actor)

            return measure_mesh(spawn, n)

        result["local"] = sweep(local, args.rounds, on_this_host, "local")
    host_counts = tuple(int(n) for n in args.hosts.split(",") if n)
    if host_counts:
        with namespace_hosts(max(host_counts)) as all_hosts:

            def on_hosts(h: int) -> dict[str, float]:
                def spawn() -> tuple[Any, Any]:
                    hosts = all_hosts.slice(hosts=slice(0, h))
                    procs = hosts.spawn_procs(per_host={"gpus": args.per_host})
                    return procs, procs.spawn("bench", actor)

                return measure_mesh(spawn, h * args.per_host)

            result["hosts"] = sweep(host_counts, args.rounds, on_hosts, "hosts")
    result["load_average_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
