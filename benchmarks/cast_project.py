"""Validate the cast model against the host sweeps, then project 1,024 hosts x 8 procs.

Reads the measured per-hop costs (``cast_costs.py``'s JSON) and one or more sweeps of
``scale_hosts_bench.py``. For each size of each sweep it runs the model on this machine's
shape (``machine`` mode: every process shares its 2 cores; the sweep's fan-out and procs per
host) and sets the predicted call + gather latency next to the measured median and tenth
percentile (the gathers that found the cores free, where the sweep recorded it), and the
predicted CPU the controller spends per gather next to the measured (which the machine's load
does not stretch), with the time the controller waited for a core (where that is a large
part of the latency, cores are the limit and the latency cannot validate the model). Then, on a
cluster whose hosts each have their own cores, it projects a cast (to the last delivery) and a
call + gather to 1,024 hosts x 8 procs, at the default fan-out and at others, and says which
cost dominates: each cost in turn set to zero, how much of the projected latency goes.

Usage: .venv/bin/python benchmarks/cast_project.py --costs results/cast-costs.json \
    [--costs another run's ...] results/scale-hosts.json [more sweeps ...] \
    [--json results/cast-projection.json]

With several ``--costs`` files each cost is the median over them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict, replace
from typing import Any

from cast_model import Costs, Shape, simulate

MONARCH_CAST_MS = 5.76  # Monarch's published p50 cast to 1,024 hosts / 8,192 actors
PROJECT_HOSTS, PROJECT_PER_HOST = 1024, 8
FANOUTS = (8, 16, 32, 64)


def validate(costs: Costs, sweep: dict[str, Any], cores: int) -> list[dict[str, float]]:
    """Predicted against measured call + gather (ms) for every size of a sweep."""
    rows = []
    for hosts, figures in sweep["sizes"].items():
        shape = Shape(int(hosts), sweep["per_host"], sweep.get("fanout", 16), "machine", cores)
        out = simulate(shape, costs)
        predicted, measured = out.gathered * 1e3, figures["gather_median_ms"]
        cpu, cpu_measured = out.controller_cpu * 1e6, figures["gather_controller_cpu_us"]
        rows.append(
            {
                "hosts": int(hosts),
                "per_host": sweep["per_host"],
                "fanout": shape.fanout,
                "predicted_ms": predicted,
                "measured_ms": measured,
                "error_pct": (predicted - measured) / measured * 100,
                "measured_p10_ms": figures.get("gather_p10_ms", float("nan")),
                "error_p10_pct": (predicted / figures.get("gather_p10_ms", float("nan")) - 1) * 100,
                "core_wait_us": figures.get("gather_controller_core_wait_us", float("nan")),
                "load_average": figures["load_average_after"],
                "controller_cpu_predicted_us": cpu,
                "controller_cpu_measured_us": cpu_measured,
                "controller_cpu_error_pct": (cpu - cpu_measured) / cpu_measured * 100,
            }
        )
    return rows


def project(costs: Costs, fanout: int) -> dict[str, float]:
    """The model's cast and gather (ms) to 1,024 hosts x 8 procs, each host its own cores."""
    out = simulate(Shape(PROJECT_HOSTS, PROJECT_PER_HOST, fanout), costs)
    return {
        "fanout": fanout,
        "cast_ms": out.delivered * 1e3,
        "gather_ms": out.gathered * 1e3,
        "depth": out.depth,
    }


def dominance(costs: Costs) -> dict[str, dict[str, float]]:
    """For each cost: how many ms of the projected cast and gather go when it is zero."""
    base = project(costs, 16)
    shares = {}
    for name in asdict(costs):
        without = project(replace(costs, **{name: 0.0}), 16)
        shares[name] = {
            "cast_ms_saved": base["cast_ms"] - without["cast_ms"],
            "gather_ms_saved": base["gather_ms"] - without["gather_ms"],
        }
    return shares


def main() -> None:
    """Read, validate, project; print (and write) the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument(
        "--costs", action="append", required=True, help="cast_costs.py's JSON (repeat: medians)"
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    runs = []
    for path in args.costs:
        with open(path) as source:
            runs.append(json.load(source)["costs_s"])
    costs = Costs(**{name: statistics.median(run[name] for run in runs) for name in runs[0]})
    rows = []
    for path in args.sweeps:
        with open(path) as source:
            rows += validate(costs, json.load(source), args.cores)
    result = {
        "costs_s": asdict(costs),
        "costs_from": args.costs,
        "validation": rows,
        "projection": [project(costs, f) for f in FANOUTS],
        "dominance_at_fanout_16": dominance(costs),
        "monarch_cast_ms": MONARCH_CAST_MS,
    }
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
