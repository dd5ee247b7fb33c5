"""Tensor-engine benchmarks: regency's engine next to torchmonarch 0.7.0's, same run.

Each figure of ``tensor_work.py`` runs in a fresh interpreter per system (regency in this
venv, Monarch in ``.bench-venvs/monarch``, built by ``setup_peers.sh``), systems alternating
within each round; the medians are reported, since other work on the machine moves every
figure. Targets (issue 15): per-op issue cost and MLP step ≤ 0.1x Monarch's; a 16 MiB
``reduce`` over 4 procs ≤ 1.5x plain ``torch.distributed`` all_reduce with gloo.
``--write-results`` puts the table into ``RESULTS.md`` between the ``tensor-bench`` markers;
commentary belongs below the end marker, where a rerun leaves it.

    .venv/bin/python benchmarks/tensor_bench.py --rounds 3 --write-results
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = str(HERE / "tensor_work.py")
MONARCH_PY = HERE.parent / ".bench-venvs" / "monarch" / "bin" / "python"
MARK_START, MARK_END = "<!-- tensor-bench:start -->", "<!-- tensor-bench:end -->"
# (figure, systems): Monarch's CPU build has no collectives, so reduce compares with torch.
FIGURES = {"chain": ("regency", "monarch"), "mlp": ("regency", "monarch"),
           "reduce": ("regency", "torch")}  # fmt: skip


def _python(system: str) -> str:
    return str(MONARCH_PY) if system == "monarch" else sys.executable


def run_once(system: str, figure: str, extra: list[str]) -> dict[str, float]:
    """One figure of one system in a fresh interpreter; its JSON line."""
    # PYTHONPATH stays for regency (and torch), so ``PYTHONPATH=$PWD/src`` measures a checkout's
    # code; Monarch's venv runs without it.
    env = {k: v for k, v in os.environ.items() if system != "monarch" or k != "PYTHONPATH"}
    done = subprocess.run(
        [_python(system), WORK, "--system", system, "--figure", figure, *extra],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{system} {figure} failed ({done.returncode}): {done.stderr[-3000:]}")
    out: dict[str, float] = json.loads(lines[-1])
    return out


def run(rounds: int, figures: list[str], extra: list[str]) -> dict[str, Any]:
    raw: dict[str, list[float]] = {}
    errors: list[str] = []
    for r in range(rounds):
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        for figure in figures:
            systems = FIGURES[figure] if r % 2 == 0 else FIGURES[figure][::-1]
            for system in systems:
                try:
                    result = run_once(system, figure, extra)
                except Exception as exc:  # one failed trial is reported, the run goes on
                    errors.append(str(exc))
                    print(f"  {system} {figure} FAILED: {exc}", file=sys.stderr, flush=True)
                    continue
                for key, value in result.items():
                    if isinstance(value, float):
                        raw.setdefault(f"{system}.{key}", []).append(value)
                        print(f"  {system}.{key}: {value:.6g}", file=sys.stderr, flush=True)
    med = {k: float(statistics.median(v)) for k, v in raw.items()}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": rounds,
        "load_avg": os.getloadavg(),
        "raw": raw,
        "median": med,
        "errors": errors,
    }


def render(doc: dict[str, Any]) -> str:
    m = doc["median"]

    def row(name: str, key: str, peer: str, peer_name: str, target: str, scale: float,
            unit: str) -> str:  # fmt: skip
        if key not in m or peer not in m:
            return f"| {name} | {'—' if key not in m else ''} | | not measured | {target} |\n"
        return (
            f"| {name} | {m[key] * scale:.3g} {unit} | {peer_name} {m[peer] * scale:.3g} {unit} "
            f"| **{m[key] / m[peer]:.3f}x** | {target} |\n"
        )

    return (
        "## Tensor engine (`benchmarks/tensor_bench.py`)\n\n"
        f"Run {doc['date']}, {doc['rounds']} rounds (systems alternating; medians), load "
        f"average at the end {doc['load_avg'][0]:.2f}. CPU, one torch thread per proc.\n\n"
        "| figure | regency | peer | ratio | target |\n|---|---|---|---|---|\n"
        + row("issue one small op (1000 chained, 2 procs)", "regency.chain_op_s",
              "monarch.chain_op_s", "Monarch", "≤ 0.1x", 1e6, "µs")
        + row("MLP forward+backward+SGD step from the controller (2 procs)",
              "regency.mlp_step_s", "monarch.mlp_step_s", "Monarch", "≤ 0.1x", 1e3, "ms")
        + row("`reduce` 16 MiB sum over 4 procs", "regency.reduce_s", "torch.reduce_s",
              "torch.distributed gloo", "≤ 1.5x", 1e3, "ms")
        + ("\nErrors: " + "; ".join(e.splitlines()[0] for e in doc["errors"]) + "\n"
           if doc["errors"] else "")
    )  # fmt: skip


def write_results(section: str, path: Path) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{MARK_START}\n{section}{MARK_END}\n"
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        text = head + block + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figures", default="chain,mlp,reduce")
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--write-results", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    extra = ["--ops", str(args.ops), "--steps", str(args.steps), "--reps", str(args.reps)]
    doc = run(args.rounds, args.figures.split(","), extra)
    print(json.dumps(doc, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if args.write_results:
        write_results(render(doc), HERE / "RESULTS.md")


if __name__ == "__main__":
    main()
