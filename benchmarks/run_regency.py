"""Benchmark regency alone (``make bench``) and print the table.

Runs ``actor_bench.py --system regency``, then ``fault_bench.py --system regency`` (the
``fault_detect`` figure), ``rdma_bench.py --system regency`` (the ``rdma`` figure) and
``multihost_bench.py`` (``multihost_calls``, ``multihost_slurm``, ``host_loss``) under
``harness.py`` with the regency interpreter
(``.venv/bin/python`` by default). For the comparison with torchmonarch and Ray, run
``run_peers.py`` (``make bench-peers``).

Usage: .venv/bin/python benchmarks/run_regency.py [--quick] [--figures a,b] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from harness import add_run_args, peer_specs, run_system, selected_figures
from report import (
    has_actor_figures,
    render_errors,
    render_fault_table,
    render_multihost_table,
    render_rdma_table,
    render_table,
)


def main() -> int:
    """Run regency's figures and print them; exit 1 if any figure failed."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_args(parser)
    parser.add_argument("--json", type=Path, help="also write the raw result here")
    args = parser.parse_args()
    spec = next(s for s in peer_specs(args.regency_python) if s.key == "regency")
    result = run_system(spec, selected_figures(args), args.quick)
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    if has_actor_figures([result]):
        print(render_table([result]))
    fault_table = render_fault_table([result])
    if fault_table:
        print("\nFault detection:\n\n" + fault_table)
    rdma_table = render_rdma_table([result])
    if rdma_table:
        print("\nRDMA transfers:\n\n" + rdma_table)
    multihost_table = render_multihost_table([result])
    if multihost_table:
        print("\nMulti-host:\n\n" + multihost_table)
    errors = render_errors([result])
    if errors:
        print("\nFailed figures:\n" + errors)
    print(f"\n{result.wall_s:.0f} s", file=sys.stderr)
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
