"""A/B of two regency source trees on the actor figures, alternating in one run.

Each round runs ``actor_bench.py --system regency`` once per tree (the order flips every
round, so drift in the machine's load hits both alike) with ``PYTHONPATH`` naming that tree's
``src``; the figures are the medians over the rounds. Typical use, the tree before a change
against the checkout::

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python benchmarks/ab_trees.py --a /tmp/before --b . --rounds 8

It prints one JSON object: each tree's per-round figures, the medians, b/a ratios and the load
average at the end. With ``--monarch PYTHON`` (a venv with torchmonarch, ``make monarch-venv``)
every round also runs ``actor_bench.py --system monarch`` with that interpreter, in the rotating
order, and the output adds Monarch's medians and each tree's ratio to them. With ``--floor``
every round also runs ``floor_bench.py`` (the same figures by a bare pickled RPC with no
runtime: its ``threads``, ``batched`` and ``asyncio`` variants), and the output adds each
tree's ratio to those: how far the tree is from what pure Python allows on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = (
    "call_one_median_us",
    "call_one_p99_us",
    "call_one_steal_ms",
    "pipelined_calls_per_s",
    "broadcasts_per_s",
)


def run_tree(tree: Path | None, figures: str, python: str = sys.executable) -> dict[str, float]:
    """One run of the actor benchmark with ``tree``'s regency first on the path, or (``tree``
    None) of Monarch's with ``python``."""
    system = "regency" if tree is not None else "monarch"
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree / "src")
    else:
        env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [python, str(HERE / "actor_bench.py"), "--system", system, "--figures", figures],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/tmp",
        check=True,
    )
    metrics: dict[str, float] = json.loads(out.stdout)["metrics"]
    return metrics


def run_floor(variant: str) -> dict[str, float]:
    """One run of ``floor_bench.py``'s ``variant`` (no regency at all)."""
    out = subprocess.run(
        [sys.executable, str(HERE / "floor_bench.py"), "--variant", variant, "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/tmp",
        check=True,
    )
    metrics: dict[str, float] = json.loads(out.stdout)["medians"][variant]
    return metrics


def ratios(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
    """``x / y`` for each figure both have (not the steal time: a condition of the run)."""
    return {m: x[m] / y[m] for m in x if m in y and y[m] and m != "call_one_steal_ms"}


def summarize(
    trees: dict[str, Path | None],
    floors: tuple[str, ...],
    rounds: dict[str, list[dict[str, float]]],
) -> dict[str, object]:
    """Each system's medians over the rounds, and the ratios of the two trees to the rest."""
    medians = {
        name: {m: statistics.median(r[m] for r in runs) for m in METRICS if m in runs[0]}
        for name, runs in rounds.items()
    }
    summary: dict[str, object] = {
        "trees": {name: str(path) for name, path in trees.items()},
        "floors": list(floors),
        "rounds": rounds,
        "medians": medians,
        "b_over_a": ratios(medians["b"], medians["a"]),
    }
    for other in ("monarch", *floors):
        if other in medians:
            summary[f"over_{other}"] = {
                tree: ratios(medians[tree], medians[other]) for tree in ("a", "b")
            }
    return summary


def main() -> None:
    """Parse the command line, alternate the trees, print the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the reference tree (before)")
    parser.add_argument("--b", type=Path, required=True, help="the tree under test (after)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--figures", default="call_one,broadcast")
    parser.add_argument("--monarch", help="a Python with torchmonarch: run it in every round too")
    parser.add_argument(
        "--floor", action="store_true", help="run floor_bench.py's variants in every round too"
    )
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"a": args.a.resolve(), "b": args.b.resolve()}
    if args.monarch:
        trees["monarch"] = None
    floors = ("floor_threads", "floor_batched", "floor_asyncio") if args.floor else ()
    names = list(trees) + list(floors)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    loads: list[float] = []
    for index in range(args.rounds):
        shift = index % len(names)  # each system first in turn
        for name in names[shift:] + names[:shift]:
            if name in floors:
                rounds[name].append(run_floor(name.removeprefix("floor_")))
            else:
                python = args.monarch if trees[name] is None else sys.executable
                rounds[name].append(run_tree(trees[name], args.figures, python))
            loads.append(os.getloadavg()[0])
            print(f"round {index} {name}: {rounds[name][-1]}", file=sys.stderr, flush=True)
    summary = summarize(trees, floors, rounds)
    summary["load_average_after_each_run"] = loads
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
