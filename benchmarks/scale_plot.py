"""Draw ``scale_bench.py``'s curves into one PNG (needs matplotlib: ``pip install -e '.[bench]'``).

Four panels: call + gather latency (median, with the 90th percentile as a band) and the CPU
that one gather costs the controller and all procs together, then broadcast deliveries per
second, each against the mesh size on a log2 axis; procs of this machine in one colour and
network-namespace hosts in another (their x is the number of procs, hosts x ``per_host``).
The grey lines are the fits of the local gather latency: ``a + b·log2 N``, ``a + b·N`` (where
above zero) and the power law ``N^k`` (a straight line on these log-log axes).

Usage: .venv/bin/python benchmarks/scale_plot.py results/scale.json scale.png
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def series(sweep: dict[str, Any], metric: str, per: int = 1) -> tuple[list[int], list[float]]:
    """(x, y) of one metric of a sweep; x is the number of procs."""
    sizes = sweep["sizes"]
    return [n * per for n in sizes], [sweep["medians"][str(n)][metric] for n in sizes]


def main() -> None:
    """Read the JSON, write the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    data = json.loads(source.read_text())
    sweeps = [("local", "procs of this machine", 1, "tab:blue")]
    if "hosts" in data:
        per = int(data["per_host"])
        sweeps.append(("hosts", f"namespace hosts, {per} procs each", per, "tab:orange"))
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    latency, cpu, deliveries, spawn = axes.flat
    for key, label, per, colour in sweeps:
        sweep = data[key]
        x, median = series(sweep, "gather_median_ms", per)
        _, p90 = series(sweep, "gather_p90_ms", per)
        latency.plot(x, median, "o-", color=colour, label=f"{label}, median")
        latency.fill_between(x, median, p90, color=colour, alpha=0.15, label=f"{label}, to p90")
        for metric, style in (("gather_controller_cpu_us", "s--"), ("gather_procs_cpu_us", "o-")):
            _, values = series(sweep, metric, per)
            who = "controller" if "controller" in metric else "all procs"
            cpu.plot(x, [v / 1e3 for v in values], style, color=colour, label=f"{label}: {who}")
        _, rate = series(sweep, "deliveries_per_s", per)
        deliveries.plot(x, rate, "o-", color=colour, label=label)
        _, seconds = series(sweep, "spawn_s", per)
        spawn.plot(x, seconds, "o-", color=colour, label=label)
    fits = data["local"].get("fits", {}).get("gather_median_ms")
    if fits:
        xs = [2 ** (i / 4) for i in range(4 * int(math.log2(max(data["local"]["sizes"]))) + 1)]
        forms = (
            ("log2N", "a + b·log₂N", lambda n, f: f["a"] + f["b"] * math.log2(n), ":"),
            ("N", "a + b·N", lambda n, f: f["a"] + f["b"] * n, "--"),
            ("power", "Nᵏ", lambda n, f: 2 ** (f["a"] + f["b"] * math.log2(n)), "-"),
        )
        for form, name, curve, style in forms:
            fit = fits[form]
            points = [(n, curve(n, fit)) for n in xs]
            points = [(n, y) for n, y in points if y > 0]  # a line fit can go below zero
            what = f"k = {fit['b']:.2f}, " if form == "power" else ""
            latency.plot(
                [n for n, _ in points],
                [y for _, y in points],
                style,
                color="grey",
                linewidth=1,
                label=f"local fit {name} ({what}R² {fit['r2']:.3f})",
            )
    titles = (
        (latency, "call + gather, one reply from every actor", "ms"),
        (cpu, "CPU per call + gather (summed over threads)", "ms of CPU"),
        (deliveries, "broadcasts: deliveries per second", "deliveries/s"),
        (spawn, "spawn until every actor answered", "s"),
    )
    for ax, title, unit in titles:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("procs in the mesh")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    load = data.get("load_average_at_end", [0])[0]
    fig.suptitle(
        f"regency: cost against mesh size (2-vCPU machine, cast fan-out 16, "
        f"median of {data['rounds']} rounds; load average {load:.1f} at the end)"
    )
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
