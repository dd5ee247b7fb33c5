"""Benchmark regency, torchmonarch 0.7 and Ray 2.60 side by side and write RESULTS.md.

Steps: make the peer venvs (``setup_peers.sh``, skipped when present); run each system's
benchmark programs (the actor figures, fault detection, RDMA) in its own interpreter under
``harness.py``; save the raw results to
``benchmarks/results/peers-<date>.json`` and the table to ``benchmarks/RESULTS.md``.
A system that cannot run (regency not importable yet, say) gets dashes and its error.

Usage: .venv/bin/python benchmarks/run_peers.py [--quick] [--figures a,b] [--systems a,b]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from benchlib import BENCH_DIR, display_path
from harness import add_run_args, peer_specs, run_system, selected_figures
from report import (
    has_actor_figures,
    machine,
    render_fault_table,
    render_rdma_table,
    render_rdma_targets,
    render_results_md,
    render_table,
)


def parse_args() -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_args(parser)
    parser.add_argument(
        "--systems",
        default="regency,monarch,ray",
        help="comma-separated subset of regency, monarch, ray",
    )
    parser.add_argument("--skip-setup", action="store_true", help="do not run setup_peers.sh")
    parser.add_argument("--results-md", type=Path, default=BENCH_DIR / "RESULTS.md")
    parser.add_argument(
        "--json", type=Path, help="raw results (default: benchmarks/results/peers-<date>.json)"
    )
    return parser.parse_args()


class LoadSampler:
    """Samples the 1-minute load average every 2 s on a daemon thread, for the report."""

    def __init__(self) -> None:
        self._start = os.getloadavg()[0]
        self._peak = self._start
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(2.0)
            self._peak = max(self._peak, os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        """Return the 1-minute load average at the start, its peak, and now."""
        end = os.getloadavg()[0]
        return {"start": self._start, "peak": max(self._peak, end), "end": end}


# RESULTS.md from this marker on is written by the other benchmark programs and by hand (TLS,
# SPMD, the tensor engine, profiles, A/B runs); a peer run keeps it as it is.
KEPT_MARKER = "<!-- kept by run_peers.py: the sections below come from other benchmark programs -->"


def keep_later_sections(text: str, path: Path) -> str:
    """``text`` followed by what ``path`` holds from :data:`KEPT_MARKER` on, if anything."""
    old = path.read_text() if path.exists() else ""
    if KEPT_MARKER not in old:
        return text
    return text.rstrip("\n") + "\n\n" + old[old.index(KEPT_MARKER) :]


def main() -> int:
    """Set up, run every system, write the JSON and the Markdown."""
    args = parse_args()
    start = time.monotonic()
    load = LoadSampler()  # other work on the machine slows every system
    if not args.skip_setup:
        subprocess.run(["bash", str(BENCH_DIR / "setup_peers.sh")], check=True)
    figures = selected_figures(args)
    wanted = args.systems.split(",")
    specs = [s for s in peer_specs(args.regency_python) if s.key in wanted]
    results = []
    for spec in specs:
        print(f"run_peers: {spec.label} ...", file=sys.stderr, flush=True)
        results.append(run_system(spec, figures, args.quick))
    now = datetime.now(timezone.utc)
    doc = {
        "date": now.strftime("%Y-%m-%d %H:%M"),
        "command": shlex.join([display_path(Path(sys.executable)), *sys.argv]),
        "quick": args.quick,
        "total_s": time.monotonic() - start,
        "machine": machine(),
        "load": load.summary(),
        "systems": [dataclasses.asdict(r) for r in results],
    }
    out_json = args.json or BENCH_DIR / "results" / f"peers-{now:%Y-%m-%d}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(doc, indent=2) + "\n")
    markdown = render_results_md(doc, results)
    args.results_md.write_text(keep_later_sections(markdown, args.results_md))
    if has_actor_figures(results):
        print(render_table(results))
    fault_table = render_fault_table(results)
    if fault_table:
        print("\n" + fault_table)
    rdma_table = render_rdma_table(results)
    if rdma_table:
        print("\n" + rdma_table + "\n\n" + render_rdma_targets(results))
    print(
        f"run_peers: wrote {args.results_md} and {out_json} in {doc['total_s']:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
