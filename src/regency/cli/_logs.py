"""``regency logs``: the proc log files of this machine, or of a cached job's hosts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from regency.cli._exec import UsageError, _add_job_arg, _load_job

_NO_JOB = 2


def add_logs_parser(commands: Any) -> None:
    """Add ``logs`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "logs",
        help="show the procs' log files",
        description="Print the log files of forwarded procs (one per proc, both streams): "
        "this machine's, or with --job those of every host of the job cached by job.state() "
        "(the job's script must have ended: a worker serves one controller at a time). "
        "The newest run by default.",
    )
    parser.add_argument("--run", metavar="ID", help="the run (its job id) to show")
    parser.add_argument("--list", action="store_true", help="list the runs instead")
    parser.add_argument("--tail", type=int, metavar="N", help="only the last N lines of each")
    parser.add_argument(
        "--here", action="store_true", help="this machine's logs even when a job is cached"
    )
    _add_job_arg(parser)


def run_logs(args: argparse.Namespace) -> int:
    """``regency logs``: print, return the exit status."""
    from regency.observe.logs import list_runs, render

    if args.tail is not None and args.tail <= 0:
        print("regency logs: --tail takes a positive number of lines", file=sys.stderr)
        return _NO_JOB
    path = Path(args.job)
    if args.here or not path.exists():
        sys.stdout.write(list_runs() if args.list else render(args.run, args.tail))
        return 0
    try:
        return _job_logs(args, path)
    except UsageError as exc:
        print(f"regency logs: {exc}", file=sys.stderr)
        return _NO_JOB


def _job_logs(args: argparse.Namespace, path: Path) -> int:
    from regency.actor._attach import AttachError
    from regency.observe.logs import LogReader

    job = _load_job(path)
    if not job._running():
        raise UsageError(f"the job cached at {path} ({type(job).__name__}) is not running any more")
    try:
        state = job.state(cached_path=path)
    except AttachError as exc:
        raise UsageError(f"cannot reach the job's hosts: {exc}") from exc
    for name, hosts in state._meshes.items():
        procs = hosts.spawn_procs()
        try:
            texts = procs.spawn("logs", LogReader).read.call(args.run, args.tail, args.list)
            for (_, text), host in zip(texts.get(timeout=60).items(), hosts._hosts, strict=True):
                sys.stdout.write(f"=== {name} {host.agent} ===\n{text}")
        finally:
            procs.stop().get(timeout=30)
    return 0
