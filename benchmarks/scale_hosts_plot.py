"""Draw ``scale_hosts_bench.py``'s curves (and the model's predictions) into one PNG.

Six panels against the number of namespace hosts (log2 axis): attach and spawn; call + gather
(median and p90, with the model's prediction from ``cast_project.py``) and ``call_one`` while
the mesh is busy; the controller's CPU per broadcast and per gather; broadcast deliveries per
second; the controller's RSS and fds per host and its idle CPU; host cuts (time until every
affected call failed and until supervision ran, and ``call_one`` p99 during the storm against
its quiet value). Needs matplotlib (``pip install -e '.[bench]'``).

Usage: .venv/bin/python benchmarks/scale_hosts_plot.py results/scale-hosts.json \
    [--projection results/cast-projection.json] [--extra results/other-sweep.json]
    [--title TEXT] out.png
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def curve(sweep: dict[str, Any], key: str, sub: str | None = None) -> tuple[list[int], list[float]]:
    """(hosts, values) of one figure, ``sub`` naming a figure inside a nested dict."""
    xs, ys = [], []
    for hosts, figures in sorted(sweep["sizes"].items(), key=lambda kv: int(kv[0])):
        value = figures.get(key)
        if sub is not None:
            value = value.get(sub) if isinstance(value, dict) else None
        if value is not None:
            xs.append(int(hosts))
            ys.append(float(value))
    return xs, ys


def main() -> None:
    """Read the JSON files, write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep")
    parser.add_argument("out")
    parser.add_argument("--projection")
    parser.add_argument("--extra", action="append", default=[], help="another sweep's JSON")
    parser.add_argument(
        "--title",
        default="regency on network-namespace hosts (TLS between hosts), 2-vCPU machine",
        help="the figure's title",
    )
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.sweep) as source:
        sweep = json.load(source)
    extras = []
    for path in args.extra:
        with open(path) as source:
            extras.append(json.load(source))
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    start, gather, cpu, rate, cost, cuts = axes.flat
    start.plot(*curve(sweep, "attach_s"), "o-", label="attach_to_workers")
    start.plot(*curve(sweep, "spawn_s"), "s-", label="spawn_procs + spawn + every actor answered")
    for data in [sweep, *extras]:
        tag = data.get("label") or f"fan-out {data.get('fanout', 16)}"
        gather.plot(*curve(data, "gather_median_ms"), "o-", label=f"call + gather median, {tag}")
        gather.plot(*curve(data, "gather_p90_ms"), ":", label=f"call + gather p90, {tag}")
    gather.plot(*curve(sweep, "call_one_busy_median_ms"), "^-", label="call_one, mesh busy")
    if args.projection:
        with open(args.projection) as source:
            rows = json.load(source)["validation"]
        for fanout in sorted({r["fanout"] for r in rows}):
            mine = sorted((r["hosts"], r["predicted_ms"]) for r in rows if r["fanout"] == fanout)
            gather.plot(*zip(*mine, strict=True), "x--", label=f"model, fan-out {fanout}")
    for data in [sweep, *extras]:
        tag = data.get("label") or f"fan-out {data.get('fanout', 16)}"
        cpu.plot(*curve(data, "broadcast_controller_cpu_us"), "o-", label=f"per broadcast, {tag}")
        net = curve(data, "broadcast_controller_cpu_net_us")
        if net[0]:
            cpu.plot(*net, "o--", label=f"per broadcast less the background, {tag}")
        paced = curve(data, "broadcast_paced_controller_cpu_us")
        if not paced[0]:  # sweeps before the windows without heartbeats
            paced = curve(data, "broadcast_paced_controller_cpu_net_us")
        if paced[0]:
            cpu.plot(*paced, "x:", label=f"per broadcast, one at a time, {tag}")
        cpu.plot(*curve(data, "gather_controller_cpu_us"), "s-", label=f"per call + gather, {tag}")
        cost.plot(*curve(data, "idle_cpu_pct"), "^-", label=f"idle CPU, % of a core, {tag}")
    rate.plot(*curve(sweep, "broadcast_deliveries_per_s"), "o-", label="deliveries/s")
    cost.plot(*curve(sweep, "controller_rss_mb_per_host"), "o-", label="RSS MB per host")
    cost.plot(*curve(sweep, "controller_fds_per_host"), "s-", label="fds per host")
    for cut, style in (("cut_1", "o-"), ("cut_rack", "s-")):
        cuts.plot(*curve(sweep, cut, "all_calls_failed_s"), style, label=f"{cut}: calls failed, s")
        cuts.plot(*curve(sweep, cut, "supervision_last_s"), style + "-", label=f"{cut}: supervised")
        _, quiet = curve(sweep, cut, "call_one_quiet_p99_ms")
        hosts, storm = curve(sweep, cut, "call_one_storm_p99_ms")
        ratio = [s / q for s, q in zip(storm, quiet, strict=True)]
        cuts.plot(hosts, ratio, style.replace("-", ":"), label=f"{cut}: call_one p99 storm/quiet")
    titles = (
        (start, "start-up", "s"),
        (gather, "latency", "ms"),
        (cpu, "controller CPU", "µs"),
        (rate, "broadcast throughput", "deliveries/s"),
        (cost, "controller cost", "per host / %"),
        (cuts, "host cuts (rack: min(64, hosts/2))", "s or ratio"),
    )
    for ax, title, unit in titles:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("namespace hosts (1 proc each)")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
