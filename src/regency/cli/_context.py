"""``regency apply`` and ``regency context``: a job described once, reused by later commands.

``regency apply myjob.job`` saves ``myjob.job`` as the active context's job, brings it up
(``job.state()``, which caches the running job in ``.regency/job_state.pkl``) and checks that a
proc starts on its hosts. Later commands (``regency exec``, ``regency kill``, scripts calling
``load_current_job().state()``) then use that job. ``regency context create|use|rm|ls`` manages
several such contexts side by side, as Monarch's ``monarch context`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

_USAGE = 2


def add_apply_parser(commands: Any) -> None:
    """Add ``apply`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "apply",
        help="provision the hosts of a job object (e.g. myjob.job)",
        description="Import the job object at MODULE.ATTR (from the current directory or "
        "PYTHONPATH), save it as the active context's job, start its hosts (job.state(), "
        "cached in .regency/job_state.pkl) and check that a proc starts on them. Without "
        "MODULE.ATTR, the active context's saved job is applied again.",
    )
    parser.add_argument(
        "module_path",
        nargs="?",
        metavar="MODULE.ATTR",
        help="dotted path to a job object (default: the active context's saved one)",
    )


def add_context_parser(commands: Any) -> None:
    """Add ``context`` (``create``, ``use``, ``rm``, ``ls``) to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "context",
        help="manage job contexts",
        description="A context (.regency/NAME/) holds one applied job; .regency/job_state.pkl "
        "links to the active one's.",
    )
    sub = parser.add_subparsers(dest="context_command", metavar="{create,use,rm,ls}")
    sub.add_parser("create", help="create a context").add_argument("name")
    sub.add_parser("use", help="make a context the active one").add_argument("name")
    sub.add_parser("rm", help="remove a context (kills its job)").add_argument("name")
    sub.add_parser("ls", help="list the contexts (* marks the active one)")
    parser.set_defaults(context_parser=parser)


def _module_path_problem(module_path: str) -> str | None:
    if module_path.endswith(".py") and Path(module_path).is_file():
        stem = Path(module_path).stem
        return (
            f"{module_path!r} is a file; name the job object as MODULE.ATTR, e.g. "
            f"'{stem}.job' for the object `job` defined in {module_path}"
        )
    return None


def run_apply(args: argparse.Namespace) -> int:
    """``regency apply``: save the spec (if given), bring the job up, check a proc starts."""
    from regency.actor import shutdown_context
    from regency.cli._ready import ReadyCheck
    from regency.job._context import _import_job, load_current_job, set_current_job

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the job's module usually sits in the project folder
    try:
        if args.module_path is not None:
            problem = _module_path_problem(args.module_path)
            if problem is not None:
                raise ValueError(problem)
            _import_job(args.module_path)  # only a spec that loads is saved
            set_current_job(args.module_path)
        job = load_current_job()
    except (ImportError, OSError, ValueError, AttributeError, TypeError) as exc:
        print(f"regency apply: {exc}", file=sys.stderr)
        return _USAGE
    try:
        state = job.state()
        meshes = dict(state._meshes)
        if not meshes:
            print("regency apply: the job has no host meshes", file=sys.stderr)
            return _USAGE
        started = time.monotonic()
        procs = next(iter(meshes.values())).spawn_procs()
        try:
            procs.spawn("_ready_check", ReadyCheck).ready.call().get()
        finally:
            procs.stop().get()
        print(f"Job is ready ({time.monotonic() - started:.0f}s)")
        return 0
    except Exception as exc:
        print(f"regency apply: the job did not come up: {exc}", file=sys.stderr)
        return 1
    finally:
        shutdown_context()


def run_context(args: argparse.Namespace) -> int:
    """``regency context create|use|rm|ls``."""
    from regency.job import _context as contexts

    command = args.context_command
    if command is None:
        args.context_parser.print_help()
        return 1
    try:
        if command == "create":
            contexts.context_create(args.name)
            print(f"Created context '{args.name}'")
        elif command == "use":
            contexts.context_use(args.name)
            print(f"Switched to context '{args.name}'")
        elif command == "rm":
            if not contexts.context_rm(args.name):
                print(f"regency context: no context named {args.name!r}", file=sys.stderr)
                return _USAGE
            print(f"Removed context '{args.name}'")
        else:
            names = contexts.contexts()
            if not names:
                print("No contexts.")
            current = contexts.current_context()
            for name in names:
                print(f"{'* ' if name == current else '  '}{name}")
    except (OSError, ValueError) as exc:
        print(f"regency context: {exc}", file=sys.stderr)
        return _USAGE
    return 0
