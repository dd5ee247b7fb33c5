"""``regency top`` and ``regency dashboard``: a running controller's tree, live.

Both find the controller's admin API as ``regency stacks`` does (its controller file, or
``--url``). ``top`` draws the tree in this terminal (:mod:`regency.observe.tui`, the ``tui``
extra); ``dashboard`` prints the link of the controller's web dashboard, which holds the token
in its fragment, and with ``--open`` opens it in a browser.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from regency.cli._controllers import add_admin_args, admin_target
from regency.cli._exec import UsageError

_USAGE = 2


def add_top_parser(commands: Any) -> None:
    """Add ``top`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "top",
        help="the live tree of hosts, procs and actors in this terminal",
        description="Show a running controller's hosts, procs and actors with their states, "
        "refreshed live, through its admin API. Keys: p stacks of the selected proc, h hide/show "
        "stopped and failed, r refresh, q quit.",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often to refresh (default 2)",
    )
    add_admin_args(parser)


def add_dashboard_parser(commands: Any) -> None:
    """Add ``dashboard`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "dashboard",
        help="print the link of a running controller's web dashboard",
        description="Print the link of a running controller's web dashboard (served by its "
        "admin API). The link holds the admin token: share it as you would the token.",
    )
    parser.add_argument("--open", action="store_true", help="open it in a web browser too")
    add_admin_args(parser)


def _client(args: argparse.Namespace, command: str) -> Any:
    from regency.observe.admin_client import AdminClient

    client = AdminClient(*admin_target(args, command))
    client.get("/v1/root")  # a wrong secret or a gone controller says so here, not later
    return client


def run_top(args: argparse.Namespace) -> int:
    """``regency top``: run the TUI until the user quits; return the exit status."""
    from regency.observe.admin_client import AdminError

    try:
        from regency.observe.tui import TopApp
    except ImportError as exc:
        print(f"regency top: needs textual ({exc}): pip install 'regency[tui]'", file=sys.stderr)
        return _USAGE
    if args.interval <= 0:
        print("regency top: --interval must be > 0 seconds", file=sys.stderr)
        return _USAGE
    try:
        client = _client(args, "top")
    except (UsageError, AdminError) as exc:
        print(f"regency top: {exc}", file=sys.stderr)
        return _USAGE
    TopApp(client, interval=args.interval).run()
    return 0


def run_dashboard(args: argparse.Namespace) -> int:
    """``regency dashboard``: print (and open) the link; return the exit status."""
    from regency.observe.admin_client import AdminError
    from regency.observe.dashboard import dashboard_link

    try:
        client = _client(args, "dashboard")
    except (UsageError, AdminError) as exc:
        print(f"regency dashboard: {exc}", file=sys.stderr)
        return _USAGE
    link = dashboard_link(client.url, client.token)
    print(link, flush=True)
    if args.open:
        import webbrowser

        if not webbrowser.open(link):
            print("regency dashboard: no web browser to open here", file=sys.stderr)
            return 1
    return 0
