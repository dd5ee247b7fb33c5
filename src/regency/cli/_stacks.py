"""``regency stacks``: every proc's Python stacks, from a running controller's admin API.

The controller must serve the admin API (``job.enable_admin()`` or
:func:`regency.observe.start_admin`); it says where in its controller file, or ``--url`` gives
it. Each proc's stacks come from ``GET /v1/pyspy/{proc}``: py-spy where the proc's host has
it, the built-in ``sys._current_frames`` dump otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from regency.cli._controllers import add_admin_args, admin_target
from regency.cli._exec import UsageError

_USAGE = 2


def add_stacks_parser(commands: Any) -> None:
    """Add ``stacks`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "stacks",
        help="print every proc's Python stacks",
        description="Print the current Python stacks (all threads) of every proc of a running "
        "controller, through its admin API: py-spy where installed, a built-in dump otherwise.",
    )
    parser.add_argument("--mesh", metavar="NAME", help="only the procs of this proc mesh")
    add_admin_args(parser)


def _procs(tree: dict[str, Any], mesh: str | None) -> list[dict[str, Any]]:
    return [
        proc
        for host in tree.get("hosts", [])
        for proc in host.get("procs", [])
        if mesh is None or proc.get("proc_mesh") == mesh
    ]


def run_stacks(args: argparse.Namespace) -> int:
    """``regency stacks``: print, return the exit status."""
    from regency.observe.admin_client import AdminClient, AdminError

    try:
        client = AdminClient(*admin_target(args, "stacks"))
        url = client.url
        procs = _procs(client.tree(), args.mesh)
        if not procs:
            which = f"of proc mesh {args.mesh!r} " if args.mesh else ""
            raise UsageError(f"the controller at {url} has no procs {which}to show")
        for proc in procs:
            header = (
                f"=== proc mesh {proc.get('proc_mesh')!r} rank {proc.get('rank')} "
                f"{proc.get('point')} ({proc.get('state')}) at {proc.get('address')} ==="
            )
            print(header)
            if proc.get("state") in ("stopped", "failed"):
                print(f"(no stacks: the proc has {proc.get('state')}: {proc.get('reason')})\n")
                continue
            print(client.stacks(proc["ref"]).rstrip("\n") + "\n", flush=True)
    except (UsageError, AdminError) as exc:
        print(f"regency stacks: {exc}", file=sys.stderr)
        return _USAGE
    return 0
