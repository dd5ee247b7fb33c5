"""Reading the proc log files a host keeps (``regency logs``).

Each host keeps the output of its forwarded procs under :func:`regency._lowlevel.proc_log_root`,
one directory per controller run (named by the run's job id), one file per proc. This module
renders them as text: the newest run by default, a named one, or the list of runs.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from regency._lowlevel import Actor, endpoint, proc_log_root, runtime


def _runs(exclude: str | None) -> list[Path]:
    """The run directories on this host, oldest first (``exclude``: a run id to leave out)."""
    root = proc_log_root()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name != exclude]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def render(run: str | None = None, tail: int | None = None, exclude: str | None = None) -> str:
    """The proc logs of run ``run`` (default: the newest) on this host.

    Each file follows a ``==> PATH <==`` line; with ``tail``, only its last ``tail`` lines.
    """
    runs = _runs(exclude)
    if run is not None:
        chosen = [p for p in runs if p.name == run]
        if not chosen:
            known = ", ".join(p.name for p in runs) or "none"
            return f"(no run {run!r} here; the runs here are: {known})\n"
        target = chosen[0]
    elif runs:
        target = runs[-1]
    else:
        return f"(no proc logs here: {proc_log_root()} holds none)\n"
    parts = []
    for path in sorted(target.glob("*.log")):
        with open(path, errors="replace") as f:
            lines = list(deque(f, maxlen=tail)) if tail is not None else f.readlines()
        text = "".join(lines)
        if text and not text.endswith("\n"):
            text += "\n"
        parts.append(f"==> {path} <==\n{text}")
    return "".join(parts) or f"(run {target.name} has no log files)\n"


def list_runs(exclude: str | None = None) -> str:
    """One line per run on this host, oldest first: its id and how many proc logs it has."""
    lines = [f"{p.name}  {len(list(p.glob('*.log')))} proc logs" for p in _runs(exclude)]
    return "\n".join(lines) + "\n" if lines else "(no runs)\n"


class LogReader(Actor):
    """Reads the proc logs of the host it runs on (for ``regency logs --job``).

    The run of the controller that spawned it (``regency logs`` itself) is left out.
    """

    @endpoint
    def read(self, run: str | None, tail: int | None, runs_only: bool) -> str:
        """:func:`render` (or with ``runs_only`` :func:`list_runs`) on this host."""
        own = runtime().job_id
        return list_runs(exclude=own) if runs_only else render(run, tail, exclude=own)
