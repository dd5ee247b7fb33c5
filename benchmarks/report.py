"""Render benchmark results as Markdown: the comparison table, the errors, the machine."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import METRICS, Metric
from harness import SystemResult

BASE = "regency"


def fmt(value: float | None) -> str:
    """Format a figure with three significant digits; None is shown as a dash."""
    if value is None:
        return "—"
    if value == 0 or 0.001 <= abs(value) < 1e6:
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:.3e}"


def ratio(numerator: float | None, denominator: float | None) -> str:
    """Format ``numerator / denominator`` as ``1.23x``, or a dash when either is missing."""
    if numerator is None or not denominator:
        return "—"
    return f"{numerator / denominator:.2f}x"


def metric_row(metric: Metric, results: Sequence[SystemResult], with_ratios: bool) -> str:
    """Return the table row of ``metric`` across ``results``."""
    arrow = "↑" if metric.higher_is_better else "↓"
    values = [r.metrics.get(metric.key) for r in results]
    cells = [f"{metric.label} ({metric.unit}) {arrow}", *(fmt(v) for v in values)]
    if with_ratios:
        cells += [ratio(values[0], v) for v in values[1:]]
    return "| " + " | ".join(cells) + " |"


def render_table(results: Sequence[SystemResult]) -> str:
    """Return the Markdown table; with several systems, add ratios of the first to the rest."""
    with_ratios = len(results) > 1
    head = ["figure", *(r.label for r in results)]
    if with_ratios:
        head += [f"{results[0].label}/{r.label.split()[0]}" for r in results[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [metric_row(m, results, with_ratios) for m in METRICS]
    return "\n".join(lines)


# The core issue's targets: (metric key, peer label prefix, bound, "max" or "min" on the ratio).
TARGETS = (
    ("call_one_median_us", "Monarch", 0.2, "max"),
    ("pipelined_calls_per_s", "Monarch", 8.0, "min"),
    ("gather_16_ms", "Monarch", 0.25, "max"),
    ("broadcasts_per_s", "Monarch", 10.0, "min"),
    ("payload_numpy_128mib_gbps", "Ray", 1.0, "min"),
    ("spawn_8_s", "Monarch", 0.5, "max"),
)


def render_targets(results: Sequence[SystemResult]) -> str:
    """Return the table of the core issue's targets, as ratios measured in this run."""
    base = results[0]
    peers = {r.label.split()[0]: r for r in results[1:]}
    labels = {m.key: m.label for m in METRICS}
    lines = ["| figure | target | measured | met |", "|---|---|---|---|"]
    for key, peer_name, bound, kind in TARGETS:
        peer = peers.get(peer_name)
        mine = base.metrics.get(key)
        theirs = peer.metrics.get(key) if peer is not None else None
        if mine is None or not theirs:
            measured, met = "—", "not measured"
        else:
            value = mine / theirs
            measured = f"{value:.2f}x {peer_name}"
            met = "yes" if (value <= bound if kind == "max" else value >= bound) else "**no**"
        sign = "≤" if kind == "max" else "≥"
        lines.append(
            f"| {labels.get(key, key)} | {sign} {bound:g}x {peer_name} | {measured} | {met} |"
        )
    return "\n".join(lines)


def render_errors(results: Sequence[SystemResult]) -> str:
    """Return a bullet list of the failed figures, one bullet per system and distinct error."""
    items = []
    for r in results:
        by_error: dict[str, list[str]] = {}
        for figure, error in r.errors.items():
            by_error.setdefault(error, []).append(f"`{figure}`")
        items += [f"- **{r.label}**, {', '.join(figs)}: {err}" for err, figs in by_error.items()]
    return "\n".join(items)


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """Describe the machine the benchmarks ran on."""
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def render_versions(results: Sequence[SystemResult]) -> str:
    """Return one bullet per system with the versions its program reported."""
    lines = []
    for r in results:
        found = r.meta.get("versions")
        text = (
            ", ".join(f"{k} {v}" for k, v in found.items())
            if found
            else "not reported (its program did not start)"
        )
        lines.append(f"- {r.label}: {text}")
    return "\n".join(lines)


def render_commands(results: Sequence[SystemResult]) -> str:
    """Return the command line each system's program ran with (timing flags omitted)."""
    return "\n".join(f"    {r.command}" for r in results)


LEGEND = (
    "↓: lower is better, ↑: higher is better. A ratio is the regency figure divided by the"
    " peer's: on ↓ rows a ratio below 1.00x means regency is faster, on ↑ rows above 1.00x."
    " A dash is a figure that was not measured; the reason is listed below the table."
    " GB is 1e9 bytes, MiB is 2^20 bytes. What each figure measures: benchmarks/README.md."
)


def render_header(doc: dict[str, Any], results: Sequence[SystemResult]) -> str:
    """Return the title, the date and duration, and the machine."""
    m = doc["machine"]
    walls = ", ".join(f"{r.label} {r.wall_s:.0f} s" for r in results)
    quick = "\n\n**Quick mode: reduced iteration counts.**" if doc["quick"] else ""
    return f"""# Peer benchmarks: regency vs torchmonarch vs Ray

Generated by `{doc["command"]}` on {doc["date"]} UTC. The whole run took
{doc["total_s"]:.0f} s ({walls}; the rest is the venv check).{quick}

## Machine

- {m["nproc"]} CPUs ({m["cpu"]}), {m["memory_gib"]} GiB memory, Linux {m["kernel"]}
- Everything on localhost; one system at a time, each in its own interpreter and venv."""


SETUP = """The peer venvs come from `bash benchmarks/setup_peers.sh` (it skips a venv that exists):

    python3 -m venv .bench-venvs/monarch
    .bench-venvs/monarch/bin/python -m pip install torch==2.13.0 torchmonarch==0.7.0 numpy
    python3 -m venv .bench-venvs/ray
    .bench-venvs/ray/bin/python -m pip install ray==2.60.0 numpy"""


def render_results_md(doc: dict[str, Any], results: Sequence[SystemResult]) -> str:
    """Return the whole RESULTS.md for a peer run described by ``doc``."""
    sections = [
        render_header(doc, results),
        "## Versions\n\n" + render_versions(results),
        "## Commands\n\n" + SETUP + "\n\nEach system's program, run by `benchmarks/harness.py`"
        " (which adds `--figures` and `--progress` and enforces a timeout per figure):\n\n"
        + render_commands(results),
        "## Results\n\n" + LEGEND + "\n\n" + render_table(results),
        "## Targets of the core issue\n\nRatios from this same run. The peers' figures move by "
        "20-35% between runs on this machine (see benchmarks/README.md), so a ratio near its "
        "bound can land on either side.\n\n" + render_targets(results),
        "## Failed or missing figures\n\n" + (render_errors(results) or "None."),
    ]
    return "\n\n".join(sections) + "\n"
