"""Run one system's benchmark programs under supervision, with a timeout per figure.

A system has up to three programs, run one after the other: the actor figures
(``actor_bench.py`` / ``ray_bench.py``), fault detection (``fault_bench.py`` /
``ray_fault_bench.py``), which kills processes, and RDMA transfers (``rdma_bench.py``; Ray has
no equivalent, so it has no such program). Each runs in its own interpreter and process group
and reports progress as JSON lines (see ``figures.py``). When a figure overruns its timeout, or
the program dies in the middle of one, the whole process tree is killed, that figure is
recorded as failed, and the program is started again on the figures still to run. Results are
plain dicts, ready for JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import BENCH_DIR, REPO_ROOT, descendants, display_path, read_events
from figures import (
    ACTOR_FIGURE_NAMES,
    FAULT_FIGURE_NAMES,
    FAULT_FIGURES,
    FIGURE_NAMES,
    FIGURES,
    MULTIHOST_FIGURE_NAMES,
    MULTIHOST_FIGURES,
    RDMA_FIGURE_NAMES,
    RDMA_FIGURES,
    STARTUP_TIMEOUT_S,
)

TIMEOUTS = {
    f.name: f.timeout_s for f in (*FIGURES, *FAULT_FIGURES, *RDMA_FIGURES, *MULTIHOST_FIGURES)
}
LOG_DIR = REPO_ROOT / ".bench-venvs" / "logs"
POLL_S = 0.2


@dataclass(frozen=True)
class Program:
    """One benchmark program of a system and the figures it runs."""

    script: str
    args: tuple[str, ...] = ()
    figures: tuple[str, ...] = ACTOR_FIGURE_NAMES

    def command(
        self, python: Path, figures: Sequence[str], progress: Path, quick: bool
    ) -> list[str]:
        """Return the argv that runs ``figures`` and reports progress to ``progress``."""
        argv = [
            str(python),
            str(BENCH_DIR / self.script),
            *self.args,
            "--figures",
            ",".join(figures),
            "--progress",
            str(progress),
        ]
        return [*argv, "--quick"] if quick else argv

    def display_command(self, python: Path, quick: bool) -> str:
        """Return the command line for the report, relative to the repository root."""
        argv = [display_path(python), f"benchmarks/{self.script}", *self.args]
        return shlex.join([*argv, "--quick"] if quick else argv)


@dataclass(frozen=True)
class SystemSpec:
    """How to run one system's benchmark programs: the actor figures, fault detection, RDMA.

    ``no_equivalent`` maps a figure that the system has nothing to measure with to the reason;
    such a figure is not run and shows a dash, without counting as a failure.
    """

    key: str
    label: str
    python: Path
    programs: tuple[Program, ...]
    no_equivalent: dict[str, str] = field(default_factory=dict)


def peer_specs(regency_python: Path) -> list[SystemSpec]:
    """Return the three systems that ``run_peers.py`` compares, regency first."""
    venvs = REPO_ROOT / ".bench-venvs"

    def monarch_api(system: str) -> tuple[Program, ...]:
        args = ("--system", system)
        return (
            Program("actor_bench.py", args),
            Program("fault_bench.py", args, FAULT_FIGURE_NAMES),
            Program("rdma_bench.py", args, RDMA_FIGURE_NAMES),
        )

    regency_only = {
        name: "regency only: the multi-host figures measure regency's worker hosts, not a peer"
        for name in MULTIHOST_FIGURE_NAMES
    }
    return [
        SystemSpec(
            "regency",
            "regency",
            regency_python,
            (
                *monarch_api("regency"),
                Program("multihost_bench.py", (), MULTIHOST_FIGURE_NAMES),
            ),
        ),
        SystemSpec(
            "monarch",
            "Monarch 0.7",
            venvs / "monarch" / "bin" / "python",
            monarch_api("monarch"),
            regency_only,
        ),
        SystemSpec(
            "ray",
            "Ray 2.60",
            venvs / "ray" / "bin" / "python",
            (
                Program("ray_bench.py"),
                Program("ray_fault_bench.py", (), FAULT_FIGURE_NAMES),
            ),
            {
                "rdma": "Ray has no equivalent of `RDMABuffer`: no one-sided reads or writes of"
                " another process's memory (objects go through its object store instead)",
                **regency_only,
            },
        ),
    ]


@dataclass
class SystemResult:
    """Everything recorded about one system's run."""

    key: str
    label: str
    commands: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    figure_seconds: dict[str, float] = field(default_factory=dict)
    attempts: int = 0
    wall_s: float = 0.0


@dataclass
class Attempt:
    """State of one launch of the benchmark program, fed by its progress events."""

    proc: subprocess.Popen[bytes]
    progress: Path
    launched: float
    offset: int = 0
    current: str | None = None
    started: float = 0.0
    finished: list[str] = field(default_factory=list)
    connected: bool = False


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its descendants, and anything left in its process group."""
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def apply_event(event: dict[str, Any], at: Attempt, result: SystemResult) -> None:
    """Fold one progress event into the attempt state and the result."""
    kind, figure = event["event"], str(event.get("figure"))
    if kind == "meta":
        at.connected = True
        if not result.meta:  # keep the first launch's import and init times
            result.meta = event["meta"]
            result.metrics.update(event["meta"].get("metrics", {}))
    elif kind == "start":
        at.current, at.started = figure, time.monotonic()
    elif kind == "done":
        result.metrics.update(event["metrics"])
        result.figure_seconds[figure] = event["seconds"]
    elif kind == "error":
        result.errors[figure] = event["error"]
    if kind in ("done", "error"):
        at.current = None
        at.finished.append(figure)


def log_tail(log: Path, lines: int = 8, limit: int = 800) -> str:
    """Return the last lines of a log file, squeezed onto one line."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    tail = " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())
    return tail[-limit:]


def overrun(at: Attempt) -> str | None:
    """Return why the attempt must be killed now, or None while it is within its limits."""
    now = time.monotonic()
    if at.current is not None and now - at.started > TIMEOUTS[at.current]:
        return f"timed out after {TIMEOUTS[at.current]:.0f}s"
    if not at.connected and not at.finished and now - at.launched > STARTUP_TIMEOUT_S:
        return f"runtime did not start within {STARTUP_TIMEOUT_S:.0f}s"
    return None


def supervise(at: Attempt, result: SystemResult) -> str | None:
    """Poll the attempt until it exits or overruns; return the overrun reason, if any."""
    while True:
        events, at.offset = read_events(at.progress, at.offset)
        for event in events:
            apply_event(event, at, result)
        exited = at.proc.poll() is not None
        reason = None if exited else overrun(at)
        if reason is not None:
            kill_tree(at.proc.pid)
            at.proc.wait()
            return reason
        if exited:
            events, at.offset = read_events(at.progress, at.offset)
            for event in events:
                apply_event(event, at, result)
            kill_tree(at.proc.pid)
            return None
        time.sleep(POLL_S)


def run_attempt(
    spec: SystemSpec,
    program: Program,
    figures: list[str],
    quick: bool,
    result: SystemResult,
    log: Path,
) -> list[str]:
    """Launch ``program`` on ``figures`` once; return the figures that are still to run."""
    progress = log.with_suffix(f".{result.attempts}.jsonl")
    progress.unlink(missing_ok=True)
    with log.open("ab") as sink:
        proc = subprocess.Popen(
            program.command(spec.python, figures, progress, quick),
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=sink,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        at = Attempt(proc, progress, time.monotonic())
        reason = supervise(at, result)
    result.attempts += 1
    if reason is None and proc.returncode != 0:
        reason = f"exited with code {proc.returncode}: {log_tail(log)}"
    if at.current is not None:
        result.errors[at.current] = reason or "exited mid-figure"
        at.finished.append(at.current)
    remaining = [f for f in figures if f not in at.finished]
    if remaining and not at.finished:
        # No progress at all: give up on the rest rather than relaunching forever.
        for figure in remaining:
            result.errors[figure] = reason or f"exited without running it: {log_tail(log)}"
        return []
    return remaining


def run_system(
    spec: SystemSpec,
    figures: Sequence[str] = FIGURE_NAMES,
    quick: bool = False,
    log_dir: Path = LOG_DIR,
) -> SystemResult:
    """Run every figure of ``spec``, program by program, relaunching after timeouts and crashes."""
    result = SystemResult(spec.key, spec.label)
    start = time.monotonic()
    plan = [(p, [f for f in figures if f in p.figures]) for p in spec.programs]
    plan = [(p, names) for p, names in plan if names]
    result.commands = [p.display_command(spec.python, quick) for p, _ in plan]
    result.not_applicable = {f: why for f, why in spec.no_equivalent.items() if f in figures}
    if plan and not spec.python.exists():
        for _, names in plan:
            for figure in names:
                result.errors[figure] = f"interpreter not found: {display_path(spec.python)}"
        return result
    log_dir.mkdir(parents=True, exist_ok=True)
    for program, names in plan:
        log = log_dir / f"{spec.key}.{Path(program.script).stem}.log"
        log.unlink(missing_ok=True)
        remaining = names
        while remaining:
            remaining = run_attempt(spec, program, remaining, quick, result, log)
    result.wall_s = time.monotonic() - start
    return result


DEFAULT_REGENCY_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """Add the options that ``run_peers.py`` and ``run_regency.py`` share."""
    parser.add_argument("--quick", action="store_true", help="about ten times fewer iterations")
    parser.add_argument(
        "--figures",
        default=",".join(FIGURE_NAMES),
        help="comma-separated subset of: " + ", ".join(FIGURE_NAMES),
    )
    parser.add_argument(
        "--regency-python",
        type=Path,
        default=DEFAULT_REGENCY_PYTHON,
        help="interpreter with regency installed (default: .venv/bin/python)",
    )


def selected_figures(args: argparse.Namespace) -> list[str]:
    """Return the figures named by ``--figures``, rejecting unknown names."""
    names = [n for n in args.figures.split(",") if n]
    unknown = sorted(set(names) - set(FIGURE_NAMES))
    if unknown:
        raise SystemExit(f"unknown figures {unknown}; expected some of {list(FIGURE_NAMES)}")
    return names
