"""The controller's CPU per broadcast against the mesh's size, on this machine's procs.

For each N (default 16, 64, 128, 256 procs of ``this_host()``, one scale actor each, at the
configured ``cast_fanout``, default 16): ``K`` streamed ``mesh.incr.broadcast()`` then
``mesh.total.call()``, which must count ``K`` from every actor. The figure is the CPU time all
of the controller's threads ran (``/proc/self/task/*/schedstat``: a loaded machine stretches
the wall time, not this) over the broadcasts, less one gather's, per broadcast; the median
over ``--rounds`` rounds (sizes ascending, then descending); beside it the calling thread's
own CPU over the broadcasts (``time.thread_time``: the sender's work, without the I/O thread's
writes and the acknowledgements it takes). Each size checks ``MemAvailable``
first and ends the curve, saying so in the JSON, when the next size does not fit.

Usage: PYTHONPATH=src .venv/bin/python benchmarks/cast_cpu_bench.py \
    [--sizes 16,64,128,256] [--rounds 3] [--json benchmarks/results/cast-cpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

from benchlib import export_bench_path
from scale_hosts_bench import CALL_TIMEOUT_S, available_mb, make_scale_actor, own_cpu_ns

SIZES = (16, 64, 128, 256)
PROC_MB = 12.0  # a local proc's memory (measured: ~11 MB)
RESERVE_MB = 1024.0


def broadcasts(n: int) -> int:
    """Broadcasts for a mesh of ``n``: about 40k deliveries, between 200 and 2,000 casts."""
    return max(200, min(2000, 40000 // n))


def measure(api: Any, actor: type, n: int) -> dict[str, float]:
    """Spawn ``n`` procs with a scale actor each; the controller's CPU per broadcast."""
    procs = api.this_host().spawn_procs(per_host={"procs": n})
    try:
        mesh = procs.spawn("cast", actor)
        mesh.ping.call().get(timeout=CALL_TIMEOUT_S)
        for _ in range(3):
            mesh.total.call().get(timeout=CALL_TIMEOUT_S)
        before = own_cpu_ns()
        base = sum(mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())
        gather_ns = own_cpu_ns() - before
        count = broadcasts(n)
        before, begin = own_cpu_ns(), time.perf_counter()
        thread_before = time.thread_time_ns()
        for _ in range(count):
            mesh.incr.broadcast()
        thread_ns = time.thread_time_ns() - thread_before
        totals = sum(mesh.total.call().get(timeout=CALL_TIMEOUT_S).values())
        seconds = time.perf_counter() - begin
        cast_ns = own_cpu_ns() - before - gather_ns
        if totals - base != count * n:
            raise AssertionError(f"{count} broadcasts to {n} actors: {totals - base} came")
        return {
            "broadcasts": count,
            "controller_cpu_per_broadcast_us": cast_ns / count / 1e3,
            # The calling thread alone: the sender's own work (the I/O thread writes the posted
            # frames and takes the acknowledgements).
            "sender_thread_cpu_per_broadcast_us": thread_ns / count / 1e3,
            "deliveries_per_s": count * n / seconds,
            "load_average": os.getloadavg()[0],
        }
    finally:
        procs.stop().get(timeout=CALL_TIMEOUT_S)


def main() -> None:
    """Parse the command line, run the sizes, print (and write) the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="proc counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=16, help="cast_fanout (16: the default)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    export_bench_path()
    import regency.actor as api
    from regency import config

    config.configure(cast_fanout=args.fanout)  # the procs inherit it
    actor = make_scale_actor(api)
    sizes = [int(n) for n in args.sizes.split(",") if n]
    runs: dict[str, list[dict[str, float]]] = {str(n): [] for n in sizes}
    result: dict[str, Any] = {"fanout": args.fanout, "runs": runs, "skipped": {}}
    for index in range(args.rounds):
        for n in sizes if index % 2 == 0 else list(reversed(sizes)):
            need, have = n * PROC_MB + RESERVE_MB, available_mb()
            if need > have:
                result["skipped"][str(n)] = f"needs ~{need:.0f} MB, {have:.0f} MB available"
                continue
            runs[str(n)].append(measure(api, actor, n))
            print(f"round {index} size {n}: {runs[str(n)][-1]}", file=sys.stderr, flush=True)
    for figure in ("controller_cpu_per_broadcast_us", "sender_thread_cpu_per_broadcast_us"):
        result[f"median_{figure}"] = {
            size: statistics.median(r[figure] for r in rs) for size, rs in runs.items() if rs
        }
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    with contextlib.suppress(Exception):
        api.shutdown_context().get()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
