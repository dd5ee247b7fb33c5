"""``regency stacks``: every proc's Python stacks, from a running controller's admin API.

The controller must serve the admin API (``job.enable_admin()`` or
:func:`regency.observe.start_admin`); it says where in its controller file, or ``--url`` gives
it. Each proc's stacks come from ``GET /v1/pyspy/{proc}``: py-spy where the proc's host has
it, the built-in ``sys._current_frames`` dump otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any

from regency.cli._controllers import (
    add_secret_args,
    choose_controller,
    default_job_secret,
    given_secret,
)
from regency.cli._exec import UsageError

_USAGE = 2
_TIMEOUT = 30.0


def add_stacks_parser(commands: Any) -> None:
    """Add ``stacks`` to the ``regency`` subcommands."""
    parser = commands.add_parser(
        "stacks",
        help="print every proc's Python stacks",
        description="Print the current Python stacks (all threads) of every proc of a running "
        "controller, through its admin API: py-spy where installed, a built-in dump otherwise.",
    )
    parser.add_argument("--url", help="the admin API's URL (default: the controller's file)")
    parser.add_argument("--mesh", metavar="NAME", help="only the procs of this proc mesh")
    add_secret_args(parser)


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """The admin URL and the bearer token to send."""
    from regency.observe import admin_token

    secret = given_secret(args)
    if args.url is not None:
        return args.url.rstrip("/"), admin_token(
            secret if secret is not None else default_job_secret()
        )
    chosen = choose_controller(
        "admin",
        args.pid,
        "stacks",
        "the admin API (start it with job.enable_admin() or regency.observe.start_admin(), "
        "or give --url)",
    )
    section = chosen.sections["admin"]
    token = admin_token(secret) if secret is not None else str(section["token"])
    return str(section["url"]).rstrip("/"), token


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise UsageError(f"{url}: refused: wrong secret (HTTP 401)") from None
        raise UsageError(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot reach the admin API at {url}: {exc}") from None


def _procs(tree: dict[str, Any], mesh: str | None) -> list[dict[str, Any]]:
    return [
        proc
        for host in tree.get("hosts", [])
        for proc in host.get("procs", [])
        if mesh is None or proc.get("proc_mesh") == mesh
    ]


def run_stacks(args: argparse.Namespace) -> int:
    """``regency stacks``: print, return the exit status."""
    try:
        url, token = _target(args)
        procs = _procs(_get(f"{url}/v1/tree", token), args.mesh)
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
            answer = _get(f"{url}/v1/pyspy/{proc['ref']}", token)
            print(str(answer.get("stacks", "")).rstrip("\n") + "\n", flush=True)
    except UsageError as exc:
        print(f"regency stacks: {exc}", file=sys.stderr)
        return _USAGE
    return 0
