"""Large ``bytes``, ``bytearray``, ``memoryview`` and numpy values to and from an actor, next to
memcpy on the same machine (issue 17, target 3).

One run spawns one proc with a sink actor. *arg*: ``call_one`` of ``measure_arg(x)`` where ``x`` is
the value (the actor returns its type name and length; the value arrives whole, or the run
fails). *result*: ``call_one`` of ``give(kind, mib)``, whose value the actor made once
beforehand and returns each time, and which the controller checks (type and length). One
untimed warm-up, then the median of ``--reps``, in GB/s (1e9 bytes/s). The baselines are timed
in the controller's process just before: ``np.copyto`` between two warm numpy arrays (*memcpy*,
on the huge pages numpy asks for), ``ctypes.memmove`` between two warm ``bytearray`` objects
(*memcpy, 4 KiB pages*) and ``bytes(x)`` (a fresh copy, as one process makes one).

``--ab A B --rounds R`` alternates two source trees (``A``'s and ``B``'s ``src`` first on
``PYTHONPATH``), the order flipping every round, and prints each tree's per-round figures, the
medians and the ratios to memcpy. Without ``--ab`` it measures the regency it imports.

Usage: .venv/bin/python benchmarks/payload_bench.py [--mib 1,16,128] [--reps 5]
       .venv/bin/python benchmarks/payload_bench.py --ab /tmp/before . --rounds 3
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import median
from figures import gbps_samples

MIB = 1 << 20
KINDS = ("bytes", "bytearray", "memoryview", "numpy")


def make(kind: str, nbytes: int) -> Any:
    """``nbytes`` of random data as ``kind``."""
    array = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    if kind == "bytes":
        return array.tobytes()
    if kind == "bytearray":
        return bytearray(array.tobytes())
    if kind == "memoryview":
        return memoryview(array.tobytes())
    return array


def length(value: Any) -> int:
    """Bytes in ``value``."""
    return int(value.nbytes) if isinstance(value, (memoryview, np.ndarray)) else len(value)


def gbps(nbytes: int, run: Callable[[], object], reps: int) -> float:
    """Median GB/s of ``run`` over ``reps`` timed runs after one warm-up."""
    return median(gbps_samples(nbytes, run, reps))


def baselines(nbytes: int, reps: int) -> dict[str, float]:
    """In-process copies of ``nbytes``: the machine's memcpy, by three measures."""
    src = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.ones(nbytes, dtype=np.uint8)
    a, b = bytearray(src.tobytes()), bytearray(nbytes)
    pa = ctypes.addressof(ctypes.c_char.from_buffer(a))
    pb = ctypes.addressof(ctypes.c_char.from_buffer(b))
    blob = src.tobytes()
    return {
        "memcpy": gbps(nbytes, lambda: np.copyto(dst, src), reps),
        "memcpy_4k": gbps(nbytes, lambda: ctypes.memmove(pb, pa, nbytes), reps),
        "fresh_bytes_copy": gbps(nbytes, lambda: bytes(memoryview(blob)), reps),
    }


def measure(mibs: list[int], reps: int) -> dict[str, Any]:
    """Every figure with the regency on the path."""
    from regency.actor import Actor, endpoint, this_host

    class Sink(Actor):
        def __init__(self) -> None:
            self.made: dict[tuple[str, int], Any] = {}

        @endpoint
        def measure_arg(self, value: Any) -> tuple[str, int]:
            return type(value).__name__, length(value)

        @endpoint
        def prepare(self, kind: str, mib: int) -> None:
            self.made[kind, mib] = make(kind, mib * MIB)

        @endpoint
        def give(self, kind: str, mib: int) -> Any:
            return self.made[kind, mib]

    # Before issue 17 a memoryview arrived as bytes: accepted, and recorded in "arrived".
    expect = {"bytes": {"bytes"}, "bytearray": {"bytearray"}, "memoryview": {"memoryview", "bytes"}}
    figures: dict[str, float] = {}
    arrived: dict[str, str] = {}
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sink = procs.spawn("sink", Sink)
        for mib in mibs:
            nbytes = mib * MIB
            for name, value in baselines(nbytes, reps).items():
                figures[f"{name}_{mib}mib"] = value
            for kind in KINDS:
                value = make(kind, nbytes)
                types = expect.get(kind, {"ndarray"})

                def check(
                    what: str, name: str, size: int, types: set[str] = types, nbytes: int = nbytes
                ) -> None:
                    if name not in types or size != nbytes:
                        raise AssertionError(f"{what}: {name} of {size} bytes, not {nbytes}")
                    arrived[what] = name

                def send(value: Any = value, what: str = f"arg_{kind}_{mib}mib") -> None:
                    check(what, *sink.measure_arg.call_one(value).get(timeout=120))

                figures[f"arg_{kind}_{mib}mib"] = gbps(nbytes, send, reps)
                del value
                sink.prepare.call_one(kind, mib).get(timeout=120)

                def fetch(kind: str = kind, mib: int = mib) -> None:
                    got = sink.give.call_one(kind, mib).get(timeout=120)
                    check(f"result_{kind}_{mib}mib", type(got).__name__, length(got))

                figures[f"result_{kind}_{mib}mib"] = gbps(nbytes, fetch, reps)
    finally:
        procs.stop().get(timeout=60)
    return {"figures": figures, "arrived": arrived, "load_average": os.getloadavg()}


def run_tree(tree: Path, mibs: str, reps: int) -> dict[str, float]:
    """One run of this program with ``tree``'s regency first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
    out = subprocess.run(
        [sys.executable, __file__, "--mib", mibs, "--reps", str(reps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd="/tmp",
        check=True,
    )
    figures: dict[str, float] = json.loads(out.stdout)["figures"]
    return figures


def ab(trees: dict[str, Path], rounds: int, mibs: str, reps: int) -> dict[str, Any]:
    """Alternate the trees ``rounds`` times; medians and ratios to memcpy."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    loads = []
    for index in range(rounds):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(run_tree(trees[name], mibs, reps))
            loads.append(os.getloadavg()[0])
            print(f"round {index} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for name, rs in runs.items()
    }
    ratios = {
        name: {
            key: round(value / m[f"memcpy_{key.rsplit('_', 1)[1]}"], 3)
            for key, value in m.items()
            if key.startswith(("arg_", "result_"))
        }
        for name, m in medians.items()
    }
    return {
        "trees": {name: str(path.resolve()) for name, path in trees.items()},
        "runs": runs,
        "medians": medians,
        "over_memcpy": ratios,
        "load_average_after_each_run": loads,
    }


def main() -> None:
    """Parse the command line; measure, or alternate two trees."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="1,16,128", help="sizes in MiB, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ab", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.ab:
        trees = {"a": args.ab[0], "b": args.ab[1]}
        print(json.dumps(ab(trees, args.rounds, args.mib, args.reps), indent=2))
        return
    print(json.dumps(measure([int(m) for m in args.mib.split(",")], args.reps)))


if __name__ == "__main__":
    main()
