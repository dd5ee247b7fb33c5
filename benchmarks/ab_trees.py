"""A/B of two regency source trees on the actor figures, alternating in one run.

Each round runs ``actor_bench.py --system regency`` once per tree (the order flips every
round, so drift in the machine's load hits both alike) with ``PYTHONPATH`` naming that tree's
``src``; the figures are the medians over the rounds. Typical use, the tree before a change
against the checkout::

    git worktree add --detach /tmp/before <commit>
    .venv/bin/python benchmarks/ab_trees.py --a /tmp/before --b . --rounds 8

It prints one JSON object: each tree's per-round figures, the medians, b/a ratios and the load
average at the end.
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
METRICS = ("call_one_median_us", "call_one_p99_us", "broadcasts_per_s")


def run_tree(tree: Path, figures: str) -> dict[str, float]:
    """One run of the actor benchmark with ``tree``'s regency first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, str(HERE / "actor_bench.py"), "--system", "regency", "--figures", figures],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/tmp",
        check=True,
    )
    metrics: dict[str, float] = json.loads(out.stdout)["metrics"]
    return metrics


def main() -> None:
    """Parse the command line, alternate the trees, print the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the reference tree (before)")
    parser.add_argument("--b", type=Path, required=True, help="the tree under test (after)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--figures", default="call_one,broadcast")
    args = parser.parse_args()
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    rounds: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for index in range(args.rounds):
        for name in ("a", "b") if index % 2 == 0 else ("b", "a"):
            rounds[name].append(run_tree(trees[name], args.figures))
            print(f"round {index} {name}: {rounds[name][-1]}", file=sys.stderr, flush=True)
    medians = {
        name: {m: statistics.median(r[m] for r in runs) for m in METRICS if m in runs[0]}
        for name, runs in rounds.items()
    }
    summary = {
        "trees": {name: str(path) for name, path in trees.items()},
        "rounds": rounds,
        "medians": medians,
        "b_over_a": {m: medians["b"][m] / medians["a"][m] for m in medians["a"]},
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
